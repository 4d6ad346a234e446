import sys

from django.core.management.base import BaseCommand

from core.cli import comma_list, int_list, line_writer, positive_int
from core.enums import Variant
from runners.cli import create_campaign_from_options
from runners.progress import wait_for_campaign


class Command(BaseCommand):
    help = ("Queue a campaign: each selected bug's CPU reproducers (latest approved version) and the chosen clean "
            "pipelines x detectors x variants x seeds. Needs a running worker (see the README).")

    def add_arguments(self, parser):
        parser.add_argument("--name", default="campaign")
        parser.add_argument("--bugs", type=comma_list, help="comma-separated bug IDs (default: every runnable bug)")
        parser.add_argument("--pipelines", type=comma_list, default=[],
                            help="comma-separated clean pipelines (fixed variant only; default: none)")
        parser.add_argument("--cuda", action="store_true",
                            help="also the bugs' CUDA reproducers, and the CUDA pipelines named (need a GPU worker)")
        parser.add_argument("--detectors", type=comma_list, help="comma-separated detector names (default: all)")
        parser.add_argument("--variants", type=comma_list, default=Variant.values)
        parser.add_argument("--seeds", type=int_list, default=[0])
        parser.add_argument("--steps", type=positive_int, help="override each reproducer's default steps")
        parser.add_argument("--wait", action="store_true", help="show progress until every run has finished")

    def handle(self, *args, **options):
        campaign = create_campaign_from_options(options)
        self.stdout.write(f"Campaign #{campaign.pk} '{campaign.name}': {campaign.runs.count()} runs queued.")
        if options["wait"]:
            wait_for_campaign(campaign, line_writer(sys.stdout))
