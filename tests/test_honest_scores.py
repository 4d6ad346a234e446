"""Scores that do not depend on what detector code can read (issue 27): submitted detectors that read the answer,
submitted, approved and scored through the real pipeline, end up flagged and unranked, with no bug caught.

The first is the detector of the finding: it wrapped ``argparse`` to read the run's variant and ``json.dumps`` to
see the program's oracle record, and on a buggy run whose oracle said "manifested" raised one alarm dated to the
trigger step. It took rank 1. The second reads only the label: an alarm at every step of a run presented as buggy.
"""
import shutil
from pathlib import Path

import pytest
from django.conf import settings

from bugs.catalog import do_load_catalog
from core.enums import Variant
from evaluation.entries import entries_export, open_entries
from evaluation.integrity import integrity_of
from evaluation.metrics import AlarmPoint, in_time
from evaluation.results import Results
from runners.actions.detector_versions import do_approve_detector_version
from runners.models import CampaignPurpose, RunStatus
from runners.tasks import execute_run

from .factories import CampaignFactory, EvaluationFactory, MaintainerFactory, UserFactory
from .test_detector_submissions import submit

pytestmark = pytest.mark.django_db

ANSWER_KEY = '''
import argparse, json
from runners.detectors import DetectorPlugin


class AnswerKey(DetectorPlugin):
    name = "answer_key"
    version = "1"
    integration = "drop-in"
    description = "Reads the run's variant and the program's own verdict."

    def install(self, probe):
        seen = {}
        parse = argparse.ArgumentParser.parse_known_args

        def parse_known_args(parser, *args, **kwargs):
            namespace, rest = parse(parser, *args, **kwargs)
            seen["variant"] = getattr(namespace, "variant", None)
            return namespace, rest

        argparse.ArgumentParser.parse_known_args = parse_known_args
        dumps = json.dumps

        def peeking_dumps(record, *args, **kwargs):
            if isinstance(record, dict) and record.get("event") == "oracle" and record.get("manifested") \\
                    and seen.get("variant") == "buggy":
                probe.alarm("answer", "the program says so", step=record.get("trigger_step") or 0)
            return dumps(record, *args, **kwargs)

        json.dumps = peeking_dumps
'''

LABEL_READER = '''
import sys
from runners.detectors import DetectorPlugin


class LabelReader(DetectorPlugin):
    name = "label_reader"
    version = "1"
    integration = "drop-in"
    description = "Alarms at every step of a run presented as buggy."

    def install(self, probe):
        buggy = "buggy" in sys.argv
        probe.on_optimizer_step(after=lambda optimizer: buggy and probe.alarm("label", "the label says buggy"))
'''


def scored(code, maintainer):
    version, campaign = do_approve_detector_version(submit(code, UserFactory()), acting_user=maintainer)
    for run in campaign.runs.all():
        execute_run(run.pk)  # the worker's path: claim, sandbox, report, do_finish_run
    assert set(campaign.runs.values_list("status", flat=True)) == {RunStatus.SUCCEEDED}, [
        (run.pk, run.failure_reason) for run in campaign.runs.exclude(status=RunStatus.SUCCEEDED)]
    return version, campaign


@pytest.mark.integration
def test_detectors_that_read_the_answer_are_flagged_and_unranked(tmp_path):
    catalog = tmp_path / "catalog"
    for folder in ("SO-60335387", "PT-FORUM-84911", "pipelines/mlp-adam"):
        shutil.copytree(Path(settings.SILENTBENCH_CATALOG_DIR) / folder, catalog / folder)
    do_load_catalog(catalog)
    EvaluationFactory(campaign=CampaignFactory(name="evaluation", purpose=CampaignPurpose.EVALUATION,
                                               parameters={"seeds": [0]}))
    maintainer = MaintainerFactory()
    answer_key, answer_campaign = scored(ANSWER_KEY, maintainer)
    label_reader, label_campaign = scored(LABEL_READER, maintainer)

    # The scoring campaign: the detector's runs, their trusted twins under plain, and the canary (the clean pipeline
    # presented as buggy) beside the pipeline presented as fixed.
    runs = list(answer_campaign.runs.select_related("detector", "reproducer_version__reproducer"))
    pipeline_runs = {run.variant for run in runs if run.reproducer_version.reproducer.bug_id is None}
    assert pipeline_runs == {Variant.BUGGY, Variant.FIXED}
    assert sum(run.detector.name == "plain" for run in runs) == 4  # 2 bugs x 2 variants

    # What the answer key did: an alarm on each buggy run, dated to the trigger step, received after training.
    judged = Results({"campaign": str(answer_campaign.pk)}, maintainer).judged
    buggy = [row for row, _, _ in judged if row["detector__name"] == "answer_key" and row["variant"] == Variant.BUGGY
             and row["reproducer_version__reproducer__bug__bug_id"]]
    assert len(buggy) == 2 and all(row["alarms"] for row in buggy)
    for row in buggy:
        [alarm] = row["alarms"]
        assert alarm.step == row["trigger_step"] and alarm.arrival_step == row["steps"] - 1
        assert not in_time(alarm, row["steps"] - 1)
    answer_findings = integrity_of(judged, "answer_key")
    assert len(answer_findings.late_alarm_runs) == 2 and answer_findings.flagged
    assert not answer_findings.without_twin and not answer_findings.rewritten_oracle

    label_findings = integrity_of(Results({"campaign": str(label_campaign.pk)}, maintainer).judged, "label_reader")
    assert label_findings.canary_pairs == 1 and len(label_findings.label_following) == 1

    ranked, _, _ = open_entries(maintainer)
    entries = {entry.name: entry for entry in ranked}
    for name, version, finding in (("answer_key", answer_key, "after the program's last training step"),
                                   ("label_reader", label_reader, "presented as buggy")):
        entry = entries[name]
        assert entry.version == version and entry.rank is None and any(finding in reason for reason in entry.flagged)
    assert entries["answer_key"].public.beyond_fixed == entries["answer_key"].public.caught == 0  # none counts
    assert [entry.name for entry in ranked if entry.rank is not None] == []  # nothing else was scored here
    export = entries_export(maintainer).frame
    assert set(export.loc[export["detector"].isin(["answer_key", "label_reader"]), "rank"]) == {"flagged"}


def test_an_alarm_counts_only_if_it_arrived_while_the_program_trained():
    last = 9
    assert in_time(AlarmPoint(step=4, arrival_step=3), last)  # raised during step 4, before its record
    assert in_time(AlarmPoint(step=4, arrival_step=5), last)  # one step late: another rank's alarm may be
    assert not in_time(AlarmPoint(step=4, arrival_step=6), last)  # dated long before it arrived
    assert not in_time(AlarmPoint(step=9, arrival_step=9), last)  # after the last step's record: after training
    assert in_time(AlarmPoint(step=9, arrival_step=8), last)  # during the last step
    assert in_time(AlarmPoint(step=3, arrival_step=None), last)  # an offline check's alarm


def test_a_fixed_variant_alarmed_under_every_probed_detector_is_pointed_out(client):
    """A reproducer can sign alarms itself (the key is in its process): one whose fixed runs every detector with a
    probe alarms on is named on the results page, for its code to be read again."""
    from evaluation.integrity import alarmed_under_every_detector

    rows = [{"bug": "TEST-FORGER", "reproducer": "cpu", "detector": name, "fixed_runs": 3, "fixed_runs_with_alarm": 3}
            for name in ("nan_inf", "grad_health")]
    rows += [{"bug": "TEST-HONEST", "reproducer": "cpu", "detector": "nan_inf", "fixed_runs": 3,
              "fixed_runs_with_alarm": 1},
             {"bug": "TEST-HONEST", "reproducer": "cpu", "detector": "grad_health", "fixed_runs": 3,
              "fixed_runs_with_alarm": 0},
             {"bug": "TEST-FORGER", "reproducer": "cpu", "detector": "traincheck", "fixed_runs": 3,
              "fixed_runs_with_alarm": 0}]  # no probe in the process: not asked
    probed = {"nan_inf", "grad_health"}
    assert alarmed_under_every_detector(rows, probed) == [("TEST-FORGER", "cpu", ["grad_health", "nan_inf"])]
    assert alarmed_under_every_detector(rows[:1], probed) == []  # one detector is not every detector
