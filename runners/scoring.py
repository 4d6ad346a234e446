"""What a detector is scored on: every CPU reproducer and clean pipeline at the published evaluation's seeds.

The published evaluation is the newest stored one (evaluation.models.Evaluation, which names its campaign); its
seeds are that campaign's. runners does not import evaluation, so they are read through the campaign it keeps."""
from .models import Campaign
from .selectors import runnable_versions

DEFAULT_SEEDS = (0, 1, 2)  # when no evaluation has been published yet


def published_seeds():
    """The seeds of the newest stored evaluation's campaign, or ``DEFAULT_SEEDS``."""
    campaign = (Campaign.objects.filter(evaluations__isnull=False).order_by("-evaluations__created_at",
                                                                             "-evaluations__id").first())
    seeds = (campaign.parameters.get("seeds") if campaign else None) or DEFAULT_SEEDS
    return tuple(seeds)


def scoring_versions():
    """Every runnable CPU reproducer of a bug, then every clean pipeline, at its latest approved version."""
    return runnable_versions() + runnable_versions(pipelines=True)
