"""What keeps the scores honest when detector code runs in the program it watches.

A detector's probe runs inside the reproducer's process, where it can read anything the program can: its
command line (the variant and the seed), its records as it writes them (the oracle's verdict and trigger step), its
clock. Review is one barrier; these are the others, and none depends on what detector code can read:

- **The ground truth is not the run's own.** A submitted detector's buggy runs are judged at the trigger step, and
  checked against the verdict, of their *trusted twin*: a run of the same reproducer version, variant, seed, steps
  and environment under ``plain``, which loads no detector code (``ground_truth``). Its scoring campaign runs them
  (runners.actions.detector_versions.do_start_scoring). A run whose own oracle record differs from its twin's was
  rewritten, or is not the same program: it is counted as such (``Integrity.rewritten_oracle``).
- **When an alarm arrived is the worker's reading.** The report reaches the worker in the order it was written, so
  an alarm is known to have arrived after the program's last step record (after training: it cannot be a
  detection), or dated to a step long before the step then completed (backdated: it cannot be either). Both are
  judged so in every table (evaluation.metrics.in_time) and counted here (``late_alarm_runs``).
- **Blind canaries.** A scoring campaign also runs every clean pipeline presented as *buggy*: the same clean
  program under the label a detector could read. A detector that follows the label alarms on these and not on the
  same pipeline presented as fixed (``label_following``).

A submitted detector with any of these is **flagged**: its entry stays on the open leaderboard, unranked, with the
evidence (which runs) for the maintainers (evaluation.entries).

What stays open, and why review still reads every submission. Code in the process can read the label, as any code
there can; it gains by it only where it also tells a canary from a bug's program, by reading the program itself
(a canary runs as ``repro.py`` without its manifest, like every bug's program, but its text is its own). It can also
hold back the program's own records and release them after its alarm, so that an alarm raised on the program's
verdict arrives "in time", or write what it read for its offline ``analyze``, whose alarms have no arrival to judge.
Each of these reads the program, its records or its verdict, which is what review refuses; none of them is caught
here. The step an alarm claims and its time are the detector's; only the order in which records arrived is the
worker's. The complete answer, an oracle computed outside the program's process, needs every reproducer to leave its
verdict to a process of its own.
"""
from collections import defaultdict
from dataclasses import dataclass, field

from bugs.models import Track
from core.enums import Variant
from runners.models import Run, RunStatus

from .metrics import in_time

BASELINE = "plain"
# What flags an entry: more late runs than a multi-rank program's one-step race could make (an alarm of rank 1 at
# the last step can arrive just after rank 0's last step record), and at least half of the canaries alarmed where
# their fixed presentation was not (a detector that is merely noisy alarms on both alike).
LATE_RUNS_TO_FLAG = 2
LABEL_FOLLOWING_SHARE = 0.5
REWRITTEN_TO_FLAG = 2  # one run's verdict can differ from its twin's where a bug is flaky


def twin_key(row):
    return (row["reproducer_version_id"], row["presented_as"], row["seed"], row["steps"], row["python_environment_id"])


def ground_truth(rows):
    """Give the rows of submitted detectors (``judged_runs``' rows) the trigger step and verdict of their trusted
    twins, keeping their own as ``own_trigger_step`` and ``own_manifested``; ``row["twin"]`` says whether one was
    found. The rows of the repository's own detectors keep their own: their code is the benchmark's."""
    submitted = [row for row in rows if row["detector__code__builtin"] is False]
    if not submitted:
        return
    versions = {row["reproducer_version_id"] for row in submitted}
    twins = {}
    for twin in (Run.objects.filter(status=RunStatus.SUCCEEDED, detector__name=BASELINE, detector__code__builtin=True,
                                    reproducer_version__in=versions).order_by("id")
                 .values("reproducer_version_id", "variant", "seed", "steps", "python_environment_id", "trigger_step",
                         "manifested")):
        twins[(twin["reproducer_version_id"], twin["variant"], twin["seed"], twin["steps"],
               twin["python_environment_id"])] = twin  # the newest wins
    for row in submitted:
        twin = twins.get(twin_key(row))
        row["own_trigger_step"], row["own_manifested"], row["twin"] = row["trigger_step"], row["manifested"], bool(twin)
        if twin:
            row["trigger_step"], row["manifested"] = twin["trigger_step"], twin["manifested"]


@dataclass
class Integrity:
    """What one detector's runs show of it (``integrity_of``), with the runs behind each finding."""

    late_alarm_runs: list = field(default_factory=list)  # buggy runs whose every alarm at/after the trigger came late
    label_following: list = field(default_factory=list)  # (canary run, its fixed twin): alarms on the canary only
    canary_pairs: int = 0
    rewritten_oracle: list = field(default_factory=list)  # runs whose own oracle record differs from the twin's
    without_twin: list = field(default_factory=list)  # buggy runs judged by their own oracle (no trusted twin)

    @property
    def reasons(self):
        """Why the entry is flagged, one sentence each; [] when it is not."""
        reasons = []
        if len(self.late_alarm_runs) >= LATE_RUNS_TO_FLAG:
            reasons.append(f"on {len(self.late_alarm_runs)} buggy run(s) its only alarms at or after the trigger step "
                           "reached the worker after the program's last training step, or dated to a step long before "
                           "they arrived: they cannot be detections, and a detector that raises them reads the "
                           "program's verdict")
        if self.label_following and len(self.label_following) >= LABEL_FOLLOWING_SHARE * self.canary_pairs:
            reasons.append(f"it alarmed on {len(self.label_following)} of {self.canary_pairs} clean pipeline run(s) "
                           "presented as buggy and not on the same program presented as fixed: its alarms follow the "
                           "label, not the program")
        if len(self.rewritten_oracle) >= REWRITTEN_TO_FLAG:
            reasons.append(f"the oracle record of {len(self.rewritten_oracle)} run(s) differs from that of the same "
                           "program's trusted twin: it was rewritten in the run")
        return reasons

    @property
    def flagged(self):
        return bool(self.reasons)

    def evidence(self):
        """{finding: [run IDs]} for the maintainers."""
        return {"late or backdated alarms": self.late_alarm_runs,
                "canaries alarmed, their fixed presentation not": [canary for canary, _ in self.label_following],
                "oracle record rewritten": self.rewritten_oracle, "judged without a trusted twin": self.without_twin}


def integrity_of(judged, detector):
    """The Integrity of ``detector``'s runs among ``judged`` (``judged_runs``)."""
    integrity = Integrity()
    canaries, presented_fixed = {}, {}
    for row, _, _ in judged:
        if row["detector__name"] != detector:
            continue
        bug = row["reproducer_version__reproducer__bug__bug_id"]
        last_step = row["steps"] - 1
        if bug is None and row["reproducer_version__reproducer__track"] == Track.CATALOG:
            # a clean pipeline: presented as buggy (a canary) or as fixed
            alarmed = bool(row["alarms"])
            (canaries if row["presented_as"] == Variant.BUGGY else presented_fixed)[
                (row["reproducer_version_id"], row["seed"], row["steps"], row["python_environment_id"])] = (
                row["id"], alarmed)
            continue
        if row["variant"] == Variant.BUGGY:
            trigger = row["trigger_step"] or 0
            qualifying = [alarm for alarm in row["alarms"] if alarm.step >= trigger]
            if qualifying and not any(in_time(alarm, last_step) for alarm in qualifying):
                integrity.late_alarm_runs.append(row["id"])  # it would have been detected by late alarms alone
            if row.get("twin") is False:
                integrity.without_twin.append(row["id"])
        if row.get("twin") and (row["own_trigger_step"], row["own_manifested"]) != (row["trigger_step"],
                                                                                     row["manifested"]):
            integrity.rewritten_oracle.append(row["id"])
    for key, (canary, alarmed) in sorted(canaries.items()):
        if key in presented_fixed:
            integrity.canary_pairs += 1
            twin, twin_alarmed = presented_fixed[key]
            if alarmed and not twin_alarmed:
                integrity.label_following.append((canary, twin))
    return integrity


def flags_by_detector(judged):
    """{detector name: Integrity} for the submitted detectors among ``judged``: the repository's own are the
    benchmark's code, not scored against it."""
    names = defaultdict(bool)
    for row, _, _ in judged:
        names[row["detector__name"]] |= row["detector__code__builtin"] is False
    return {name: integrity_of(judged, name) for name, submitted in names.items() if submitted}


def alarmed_under_every_detector(detection, probed):
    """The reproducers whose fixed variant raised alarms under every detector with a probe in its process that ran
    it (at least two): ``detection`` is the detection table's rows, ``probed`` the names of the detectors that run
    in the program's process. The alarm key is in that process, so a reproducer can sign alarms itself; a fixed
    variant that every such detector alarms on has either a real fault left in it or forged alarms: its code needs
    reading again. [(bug, reproducer, [detectors])]."""
    by_reproducer = defaultdict(dict)
    for row in detection:
        if row["detector"] in probed and row.get("fixed_runs"):
            by_reproducer[(row["bug"], row["reproducer"])][row["detector"]] = row.get("fixed_runs_with_alarm") or 0
    return [(bug, reproducer, sorted(alarmed)) for (bug, reproducer), alarmed in sorted(by_reproducer.items())
            if len(alarmed) >= 2 and all(alarmed.values())]

