"""Overhead of each detector: interleaved plain/instrumented pairs on one workload, run one at a time.

Each pair runs the plain baseline and the instrumented program back to back (the order alternates
from pair to pair, so that a drift in machine load hits both sides alike). Per pair we take the ratio
of the steady-state step time (median time between consecutive steps of rank 0, after the warm-up
steps) and of the end-to-end wall time (for an offline detector, the wall time of the run plus its
offline check). The table gives the median ratio over pairs. Fit and check are timed apart.
"""
import logging
import statistics
import time

from runners.actions.campaigns import do_cancel_campaign, do_create_campaign
from runners.actions.runs import do_give_up_running_runs
from runners.models import CampaignPurpose, RunStatus
from runners.plans import CampaignPlan
from runners.tasks import execute_run

logger = logging.getLogger(__name__)
WARM_UP_STEPS = 5
OVERHEAD_COLUMNS = [
    "detector", "pairs", "pairs_planned", "median_step_time_ratio", "median_end_to_end_ratio",
    "median_plain_step_ms", "median_step_ms", "median_check_seconds", "fit_seconds",
]


def steady_step_seconds(step_records, warm_up=WARM_UP_STEPS):
    times = [r["time"] for r in sorted(step_records, key=lambda r: r["step"])
             if r["rank"] == 0 and r.get("time") is not None]
    gaps = [later - earlier for earlier, later in zip(times[warm_up:], times[warm_up + 1:])]
    return statistics.median(gaps) if gaps else None


def end_to_end_seconds(run):
    return run.wall_seconds + (run.analysis_seconds or 0)


def do_measure_overhead(workload, detectors, plain, pairs=5, steps=None, write=None, *, deadline=None,
                        baseline_every=0, acting_user=None):
    """Run the overhead pairs in this process, one run at a time; return (campaign, records).

    The runs belong to a campaign of purpose ``overhead``, created through do_create_campaign but not
    enqueued: the reconciler leaves such runs to the process that times them, and whatever this process
    could not run (it was interrupted) is cancelled, and the run it was timing then fails as lost. Past
    ``deadline`` (time.monotonic()), no pair starts: the records count the pairs measured before it.

    ``baseline_every`` N > 0: each detector timed once, against a shared baseline run before every N detectors and
    at the end (``CampaignPlan.bracketed``): N + 1 runs for N detectors instead of 2N, for a workload whose steps
    are long enough that one run's steady step time is stable (a GPU's); ``pairs`` is then 1."""
    if baseline_every:
        return _measure_bracketed(workload, detectors, plain, baseline_every, steps, write, deadline, acting_user)
    plan = CampaignPlan.pairs(workload, plain, detectors, pairs, steps)
    campaign = do_create_campaign(f"overhead on {workload.reproducer}", plan, CampaignPurpose.OVERHEAD, enqueue=False,
                                  acting_user=acting_user)
    runs = list(campaign.runs.order_by("id"))  # created in the plan's order: (baseline, detector) per pair
    pairs_by_detector = {detector.name: [tuple(runs[start:start + 2]) for start in range(offset, offset + 2 * pairs, 2)]
                         for detector, offset in zip(detectors, range(0, len(runs), 2 * pairs))}
    records, measured = [], False
    try:
        for detector in detectors:
            records.append(_measure_pairs(detector, pairs_by_detector[detector.name], pairs, write, deadline))
        measured = True
    finally:
        _close(campaign, measured, acting_user)
    return campaign, records


def _close(campaign, measured, acting_user):
    """Leave nothing of the overhead campaign running or queued; a failure to do so is raised when the measuring
    finished normally, and only logged after an interruption (which is raised instead)."""
    try:
        do_give_up_running_runs(campaign, acting_user=acting_user)
        do_cancel_campaign(campaign, acting_user=acting_user)
    except Exception:
        if measured:
            raise
        logger.exception("overhead campaign %s: could not close it after the interruption", campaign.pk)


def _measure_bracketed(workload, detectors, plain, every, steps, write, deadline, acting_user):
    """``do_measure_overhead`` with a shared baseline. Past ``deadline`` no run starts: the detectors timed since the
    last baseline run are compared with it alone."""
    plan = CampaignPlan.bracketed(workload, plain, detectors, every, steps)
    campaign = do_create_campaign(f"overhead on {workload.reproducer}", plan, CampaignPurpose.OVERHEAD, enqueue=False,
                                  acting_user=acting_user)
    samples, measured = {}, False

    def settle(waiting, bases):
        for timed in waiting:
            samples[timed.detector_id] = sample = bracketed_sample(
                [base for base in bases if base.status == RunStatus.SUCCEEDED], timed)
            if write:
                write(f"  {timed.detector.name}: " + ("a run failed, left out" if sample is None else
                      f"step x{sample['step_ratio'] or 0:.2f}, end to end x{sample['end_to_end_ratio']:.2f}"))

    try:
        bases, waiting = [], []
        for run in campaign.runs.order_by("id"):
            if deadline is not None and time.monotonic() > deadline:
                break
            execute_run(run.pk)
            run.refresh_from_db()
            if run.detector_id != plain.pk:
                waiting.append(run)
                continue
            bases = [*bases[-1:], run]  # the baseline runs on either side of the detectors waiting
            settle(waiting, bases)
            waiting = []
        settle(waiting, bases[-1:])
        measured = True
    finally:
        _close(campaign, measured, acting_user)
    return campaign, [overhead_record(detector.name, [samples[detector.pk]] if samples.get(detector.pk) else [], 1)
                      for detector in detectors]


def bracketed_sample(bases, instrumented):
    """A detector's one sample against the succeeded baseline runs around it, or None when it or all of them
    failed."""
    if instrumented.status != RunStatus.SUCCEEDED or not bases:
        return None
    return sample_against(bases, instrumented)


def _measure_pairs(detector, detector_pairs, pairs, write, deadline=None):
    samples = []
    for pair, (base, instrumented) in enumerate(detector_pairs):
        if deadline is not None and time.monotonic() > deadline:  # the pairs measured so far are kept
            if write:
                write(f"  {detector.name}: {pairs - pair} pair(s) not timed, the overhead's time is up")
            break
        for run in ((base, instrumented) if pair % 2 == 0 else (instrumented, base)):
            execute_run(run.pk)
        base.refresh_from_db()
        instrumented.refresh_from_db()
        if base.status != RunStatus.SUCCEEDED or instrumented.status != RunStatus.SUCCEEDED:
            if write:
                write(f"  {detector.name} pair {pair + 1}: a run failed, pair left out "
                      f"({base.failure_reason or instrumented.failure_reason})")
            continue
        samples.append(pair_sample(base, instrumented))
        if write:
            step_ratio = samples[-1]["step_ratio"]  # None: too few steps to time a steady one
            write(f"  {detector.name} pair {pair + 1}/{pairs}: step "
                  f"{'–' if step_ratio is None else f'x{step_ratio:.2f}'}, "
                  f"end to end x{samples[-1]['end_to_end_ratio']:.2f}")
    return overhead_record(detector.name, samples, pairs)


def pair_sample(base, instrumented):
    return sample_against([base], instrumented)


def sample_against(bases, instrumented):
    """Ratios of ``instrumented`` (succeeded) to the baseline runs ``bases`` (succeeded; their median step time and
    wall time)."""
    base_steps = [step for step in (steady_step_seconds(base.step_records) for base in bases) if step]
    base_step = statistics.median(base_steps) if base_steps else None
    step = steady_step_seconds(instrumented.step_records)
    base_wall = statistics.median(base.wall_seconds for base in bases)
    return {
        "step_ratio": step / base_step if step and base_step else None,
        "end_to_end_ratio": end_to_end_seconds(instrumented) / base_wall,
        "plain_step_seconds": base_step, "step_seconds": step,
        "plain_wall_seconds": base_wall, "wall_seconds": instrumented.wall_seconds,
        "check_seconds": instrumented.analysis_seconds,
        "fit_seconds": instrumented.fit_artifact.fit_seconds if instrumented.fit_artifact_id else None,
    }


def _median(samples, key, scale=1):
    values = [s[key] for s in samples if s[key] is not None]
    return round(scale * statistics.median(values), 4) if values else None


def overhead_record(detector, samples, pairs):
    return {
        "detector": detector, "pairs": len(samples), "pairs_planned": pairs,
        "median_step_time_ratio": _median(samples, "step_ratio"),
        "median_end_to_end_ratio": _median(samples, "end_to_end_ratio"),
        "median_plain_step_ms": _median(samples, "plain_step_seconds", scale=1000),
        "median_step_ms": _median(samples, "step_seconds", scale=1000),
        "median_check_seconds": _median(samples, "check_seconds"),
        "fit_seconds": _median(samples, "fit_seconds"),
    }
