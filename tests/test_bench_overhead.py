"""manage.py bench_overhead: the evaluation's interleaved overhead pairs for a few detectors, printed."""
import io
import re

import pytest
from django.core.management import call_command

from bugs.catalog import do_load_catalog
from runners.models import Campaign, CampaignPurpose

pytestmark = [pytest.mark.django_db, pytest.mark.integration]


def test_it_times_plain_against_each_detector_and_prints_the_medians(settings):
    do_load_catalog(settings.SILENTBENCH_CATALOG_DIR)
    out = io.StringIO()
    call_command("bench_overhead", "--detectors", "nan_inf,shadow_precise", "--pairs", "1", "--workload", "mlp-adam",
                 stdout=out)
    rows = {line.split()[0]: line.split()[1:] for line in out.getvalue().splitlines()
            if re.match(r"(nan_inf|shadow_precise) +1 ", line)}
    assert set(rows) == {"nan_inf", "shadow_precise"}, out.getvalue()
    assert all(float(row[1]) > 0 and float(row[2]) > 0 for row in rows.values())  # step and end-to-end ratios
    campaign = Campaign.objects.get(purpose=CampaignPurpose.OVERHEAD)
    assert campaign.runs.count() == 4 and campaign.completed_at is not None


def test_a_run_too_short_to_time_a_steady_step_is_printed_without_a_step_ratio(settings):
    do_load_catalog(settings.SILENTBENCH_CATALOG_DIR)
    out = io.StringIO()
    call_command("bench_overhead", "--detectors", "nan_inf", "--pairs", "1", "--workload", "mlp-adam", "--steps", "2",
                 stdout=out)
    assert re.search(r"nan_inf pair 1/1: step –, end to end x[0-9.]+", out.getvalue()), out.getvalue()
