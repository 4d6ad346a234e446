"""What the run lifecycle's management commands share (run_campaign, verify_bugs, and evaluation's evaluate and
quickstart): a campaign from command-line options."""
from django.core.exceptions import ValidationError
from django.core.management.base import CommandError

from core.enums import Variant

from .actions.campaigns import do_create_campaign
from .plans import CampaignPlan


def plan_from_options(options, skip=None):
    """The CampaignPlan the command-line options name; its problems become one CommandError."""
    try:
        return CampaignPlan.resolve(bugs=options.get("bugs"), pipelines=options.get("pipelines") or (),
                                    detectors=options.get("detectors"),
                                    variants=options.get("variants", Variant.values),
                                    seeds=options.get("seeds", (0,)), steps=options.get("steps"),
                                    cuda=options.get("cuda", False), skip=skip)
    except ValidationError as error:
        raise CommandError("; ".join(f"{field}: {message}" for field, messages in error.message_dict.items()
                                     for message in messages)) from error


def create_campaign_from_options(options):
    """Queue the campaign the options name, as the operator."""
    return do_create_campaign(options["name"], plan_from_options(options), acting_user=None)
