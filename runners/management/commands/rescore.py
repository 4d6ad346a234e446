import sys

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError

from core.cli import line_writer, positive_int
from core.enums import ReviewState
from runners.actions.detector_versions import do_start_scoring
from runners.actions.detectors import do_record_builtin_detector_version
from runners.detectors import all_plugins, campaign_plugins, get_plugin
from runners.models import DetectorVersion
from runners.worker.local import wait_with_local_worker


def newest_approved(name, version=None):
    """The DetectorVersion to score: a built-in's current code, or a submitted detector's newest approved version
    (or its approved ``version``)."""
    if name in all_plugins() and name not in campaign_plugins():
        raise CommandError(f"{name} is run only by manage.py evaluate_sensitivity: nothing scores it.")
    if name in campaign_plugins() and version in (None, get_plugin(name).version):
        return do_record_builtin_detector_version(get_plugin(name))
    versions = DetectorVersion.objects.filter(name=name, review_state=ReviewState.APPROVED)
    if version is not None:
        versions = versions.filter(version=version)
    found = versions.order_by("-reviewed_at", "-id").first()
    if found is None:
        raise CommandError(f"No approved detector {name}{f' version {version}' if version else ''}.")
    return found


class Command(BaseCommand):
    help = ("Score a detector again on the current corpus: a scoring campaign of its newest approved version over "
            "every CPU reproducer and clean pipeline, both variants, at the published evaluation's seeds (the one "
            "approval starts).")

    def add_arguments(self, parser):
        parser.add_argument("detector", help="the detector's name (built-in or submitted)")
        parser.add_argument("--detector-version", help="an approved version of it (default: the newest)")
        parser.add_argument("--wait", action="store_true", help="wait for the campaign, with a local worker")
        parser.add_argument("--concurrency", type=positive_int, default=2, help="runs at a time on the local worker")

    def handle(self, *args, detector, detector_version, wait, concurrency, **options):
        detector_version = newest_approved(detector, detector_version)
        try:
            campaign = do_start_scoring(detector_version, acting_user=None)  # the operator
        except ValidationError as error:
            raise CommandError(" ".join(error.messages)) from error
        self.stdout.write(f"Campaign #{campaign.pk}: {campaign.runs.count()} runs of {detector_version} at seeds "
                          f"{', '.join(map(str, campaign.parameters['seeds']))}.")
        if wait:
            wait_with_local_worker(campaign, line_writer(sys.stdout), "rescore", concurrency)
