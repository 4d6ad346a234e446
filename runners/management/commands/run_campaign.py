import sys

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError

from runners.progress import line_writer, wait_for_campaign
from runners.services import detector_record, do_create_campaign, runnable_versions, sync_detectors


def csv(value):
    return [item.strip() for item in value.split(",") if item.strip()]


class Command(BaseCommand):
    help = ("Queue a campaign: each selected bug's CPU reproducers (latest approved version) x detectors x "
            "variants x seeds. Needs a running worker (see the README).")

    def add_arguments(self, parser):
        parser.add_argument("--name", default="campaign")
        parser.add_argument("--bugs", type=csv, help="comma-separated bug IDs (default: every runnable bug)")
        parser.add_argument("--detectors", type=csv, help="comma-separated detector names (default: all)")
        parser.add_argument("--variants", type=csv, default=["buggy", "fixed"])
        parser.add_argument("--seeds", type=lambda v: [int(s) for s in csv(v)], default=[0])
        parser.add_argument("--steps", type=int, help="override each reproducer's default steps")
        parser.add_argument("--wait", action="store_true", help="show progress until every run has finished")

    def handle(self, *args, **options):
        campaign = create_campaign_from_options(options)
        self.stdout.write(f"Campaign #{campaign.pk} '{campaign.name}': {campaign.runs.count()} runs queued.")
        if options["wait"]:
            wait_for_campaign(campaign, line_writer(sys.stdout))


def create_campaign_from_options(options):
    versions = runnable_versions(options["bugs"])
    if options["bugs"]:
        missing = set(options["bugs"]) - {v.reproducer.bug.bug_id for v in versions}
        if missing:
            raise CommandError(f"No approved CPU reproducer for: {', '.join(sorted(missing))}")
    try:
        detectors = ([detector_record(name) for name in options["detectors"]] if options["detectors"]
                     else list(sync_detectors().values()))
        return do_create_campaign(None, options["name"], versions, detectors, options["variants"],
                                  options["seeds"], options["steps"])
    except KeyError as error:
        raise CommandError(error.args[0]) from error
    except ValidationError as error:
        raise CommandError("; ".join(error.messages)) from error
