"""What a detector is scored on: every CPU reproducer and clean pipeline at the published evaluation's seeds.

The published evaluation is the newest stored one (evaluation.models.Evaluation, which names its campaign); its
seeds are that campaign's. runners does not import evaluation, so they are read through the campaign it keeps.

A submitted detector's scoring campaign also runs each bug reproducer's *trusted twins*: the same runs under
``plain`` with ``TWIN_CONFIG`` (a Detector row of their own, so that ``plain``'s own entry is never scored by
another detector's campaign), whose oracle is the ground truth its runs are judged by (evaluation.integrity)."""
from .models import Campaign
from .selectors import runnable_versions

DEFAULT_SEEDS = (0, 1, 2)  # when no evaluation has been published yet
TWIN_CONFIG = {"trusted_twin": True}  # plain ignores its config: this only names the twins' Detector row


def published_seeds():
    """The seeds of the newest stored evaluation's campaign, or ``DEFAULT_SEEDS``."""
    campaign = (Campaign.objects.filter(evaluations__isnull=False).order_by("-evaluations__created_at",
                                                                             "-evaluations__id").first())
    seeds = (campaign.parameters.get("seeds") if campaign else None) or DEFAULT_SEEDS
    return tuple(seeds)


def scoring_versions():
    """Every runnable CPU reproducer of a bug, then every clean pipeline, at its latest approved version."""
    return runnable_versions() + runnable_versions(pipelines=True)
