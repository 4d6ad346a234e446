"""What a completed campaign's runs make immutable, kept in the shared cache (core.caching): their counts by
status, and whatever else a page computes from them under ``completed_key``.

A completed campaign's runs no longer change: none is queued or running, and a retry, the one way to run them
again, clears ``completed_at`` under the campaign's lock (runners.actions). The key names the completion time,
so a campaign completed again after a retry is a new key."""
from core.caching import cached_many

from .models import status_counts


def completed_key(campaign, part):
    """The cache key of ``part`` of what ``campaign``'s runs hold, or None while it is open."""
    if campaign.completed_at is None:
        return None
    return f"campaign:{campaign.pk}:{campaign.completed_at.isoformat()}:{part}"


def cached_status_counts(campaigns):
    """``runners.models.status_counts`` of ``campaigns``: those of completed campaigns from the cache, the others
    (and the cache's misses) in one query."""
    by_pk = {campaign.pk: campaign for campaign in campaigns}
    return cached_many({campaign.pk: completed_key(campaign, "status-counts") for campaign in campaigns},
                       lambda pks: status_counts([by_pk[pk] for pk in pks]))
