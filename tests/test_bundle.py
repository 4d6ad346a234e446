"""A bundle of detectors (runners.detectors.bundle): one sealed run shows each member the alarms a run of its own
shows, and what may not share a run is refused."""
from collections import Counter
from pathlib import Path

import pytest
from django.urls import reverse

from runners.actions.runs import do_finish_run
from runners.detectors import all_plugins
from runners.detectors.bundle import Bundle, bundling_refusal
from runners.execution import execute
from runners.models import Alarm, RunStatus
from sensitivity.mutants import mutant_programs

from .factories import DetectorFactory, ReproducerVersionFactory, RunFactory

CATALOG = Path(__file__).resolve().parents[1] / "catalog"
SHAREABLE = sorted(name for name, plugin in all_plugins().items() if not bundling_refusal(plugin))


def test_only_detectors_that_only_observe_may_share_a_run():
    plugins = all_plugins()
    assert "detect_anomaly" not in SHAREABLE  # it swallows the error a NaN backward raises: the program changes
    assert "plain" not in SHAREABLE and "differential" not in SHAREABLE  # nothing inside the process to share
    assert "traincheck" not in SHAREABLE and Bundle.name not in SHAREABLE
    assert len(SHAREABLE) >= 15 and all(plugins[name].only_observes for name in SHAREABLE)
    assert "shadow_eager" not in SHAREABLE  # it skips modules that others' global forward hooks watch

    class SlowObserver(type(plugins["nan_inf"])):
        time_limit_factor = 3  # its runs are given longer: a bundle's runs are not

    assert "set up for it alone" in bundling_refusal(SlowObserver())


def sealed(mutant, detector, variant="buggy"):
    version = ReproducerVersionFactory(files=mutant.files, manifest=mutant.manifest, default_steps=mutant.steps,
                                       time_limit_seconds=120, memory_mb=4096)
    run = RunFactory(reproducer_version=version, detector=detector, variant=variant, steps=mutant.steps)
    outcome = execute(run)
    assert outcome.succeeded, outcome.failure_reason
    return outcome


@pytest.mark.django_db
@pytest.mark.parametrize("mutant_id", ["MUT-bitflip-weight-exp-hi-mlp-t8-transient", "MUT-rank-desync-eps-1e-2-ddp-t8"])
def test_a_bundled_run_shows_each_member_the_alarms_of_its_own_run(mutant_id):
    """Real processes, warm and sealed (DDP's two ranks forked): alarm for alarm (member, rule, step, rank), the same
    losses, and every member raises at least its alarms alone, none of them on another's behalf."""
    mutant = next(mutant for mutant in mutant_programs(CATALOG) if mutant.mutant_id == mutant_id)
    bundled = sealed(mutant, DetectorFactory(name=Bundle.name, config={"detectors": SHAREABLE}))
    alone = {name: sealed(mutant, DetectorFactory(name=name)) for name in SHAREABLE}
    assert Counter((alarm["detector"], alarm["rule"], alarm["step"], alarm["rank"]) for alarm in bundled.alarms) == \
        Counter((name, alarm["rule"], alarm["step"], alarm["rank"])
                for name, outcome in alone.items() for alarm in outcome.alarms)
    assert bundled.alarms, "the fault went unseen by every member: the comparison shows nothing"
    losses = [(record["rank"], record["step"], record["loss"]) for record in bundled.steps]
    assert all(losses == [(r["rank"], r["step"], r["loss"]) for r in outcome.steps] for outcome in alone.values())
    assert all(alarm["detector"] == "" for outcome in alone.values() for alarm in outcome.alarms)


@pytest.mark.django_db
def test_a_bundle_refuses_a_member_that_changes_the_program_and_keeps_no_name_a_run_does_not_hold():
    mutant = next(mutant for mutant in mutant_programs(CATALOG)
                  if mutant.mutant_id == "MUT-bitflip-weight-exp-hi-mlp-t8-transient")
    version = ReproducerVersionFactory(files=mutant.files, manifest=mutant.manifest, default_steps=mutant.steps,
                                       time_limit_seconds=120, memory_mb=4096)
    run = RunFactory(reproducer_version=version, variant="buggy", steps=mutant.steps,
                     detector=DetectorFactory(name=Bundle.name, config={"detectors": ["nan_inf", "detect_anomaly"]}))
    outcome = execute(run)
    assert not outcome.succeeded and "cannot watch a run in a bundle" in outcome.stderr
    # a detector alone: whatever name its probe writes on an alarm, the run's own detector raised it
    alone = RunFactory(reproducer_version=version, variant="buggy", steps=mutant.steps, status=RunStatus.RUNNING,
                       detector=DetectorFactory(name="grad_health"))
    assert do_finish_run(alone, execute(alone))  # the worker's path: the alarm rows as stored
    assert Alarm.objects.filter(run=alone).exists() and not Alarm.objects.filter(run=alone).exclude(detector="")


@pytest.mark.django_db
def test_a_bundled_runs_page_and_record_name_the_member_behind_each_alarm(client):
    mutant = next(mutant for mutant in mutant_programs(CATALOG)
                  if mutant.mutant_id == "MUT-bitflip-weight-exp-hi-mlp-t8-transient")
    version = ReproducerVersionFactory(files=mutant.files, manifest=mutant.manifest, default_steps=mutant.steps,
                                       time_limit_seconds=120, memory_mb=4096)
    run = RunFactory(reproducer_version=version, variant="buggy", steps=mutant.steps, status=RunStatus.RUNNING,
                     detector=DetectorFactory(name=Bundle.name, config={"detectors": ["nan_inf", "grad_health"]}))
    assert do_finish_run(run, execute(run))
    assert set(Alarm.objects.filter(run=run).values_list("detector", flat=True)) == {"grad_health"}
    page = client.get(reverse("runners:run", args=[run.pk])).content.decode()
    assert "<th>Detector</th>" in page and "<td>grad_health</td>" in page
    record = client.get(reverse("runners:run_record", args=[run.pk])).json()
    assert {alarm["detector"] for alarm in record["alarms"]} == {"grad_health"}


@pytest.mark.django_db
def test_no_campaign_score_or_comparison_takes_the_bundle_or_a_sensitivity_campaign(client):
    from django.core.exceptions import ValidationError
    from django.core.management import call_command
    from django.core.management.base import CommandError

    from evaluation.compare import side
    from runners.actions.detector_versions import do_start_scoring
    from runners.actions.detectors import do_record_builtin_detector_version
    from runners.detectors import get_plugin
    from runners.models import CampaignPurpose
    from runners.plans import CampaignPlan

    from .factories import CampaignFactory

    with pytest.raises(ValidationError, match="unknown detector 'bundle'; a campaign may name"):
        CampaignPlan.resolve(bugs=[], pipelines=(), detectors=["bundle"])
    with pytest.raises(CommandError, match="run only by manage.py evaluate_sensitivity"):
        call_command("rescore", "bundle")
    with pytest.raises(ValidationError, match="run only by the sensitivity track"):
        do_start_scoring(do_record_builtin_detector_version(get_plugin(Bundle.name)), acting_user=None)
    assert "the sensitivity track only" in client.get("/detectors/bundle/").content.decode()
    campaign = CampaignFactory(purpose=CampaignPurpose.SENSITIVITY)
    assert client.get(f"/results/?campaign={campaign.pk}").status_code == 404
    with pytest.raises(LookupError):
        side(f"campaign:{campaign.pk}")
    page = client.get(reverse("runners:campaign", args=[campaign.pk])).content.decode()
    assert reverse("evaluation:sensitivity") in page and f"/results/?campaign={campaign.pk}" not in page
