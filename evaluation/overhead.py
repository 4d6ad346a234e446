"""Overhead of each detector: interleaved plain/instrumented pairs on one workload, run one at a time.

Each pair runs the plain baseline and the instrumented program back to back (the order alternates
from pair to pair, so that a drift in machine load hits both sides alike). Per pair we take the ratio
of the steady-state step time (median time between consecutive steps of rank 0, after the warm-up
steps) and of the end-to-end wall time (for an offline detector, the wall time of the run plus its
offline check). The table gives the median ratio over pairs. Fit and check are timed apart.
"""
import statistics

from django.db import transaction

from runners.models import Campaign, Run, RunStatus
from runners.services import queue_for
from runners.tasks import execute_run

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


def do_create_overhead_campaign(workload, detectors, plain, pairs, steps=None):
    """A campaign of (plain, instrumented) run pairs per detector, not enqueued: the caller runs them in order.

    Each pair has its own plain run, so that every instrumented run is compared with a baseline
    measured right beside it. Pair ``i`` uses seed ``i`` on both sides.
    """
    steps = steps or workload.default_steps
    with transaction.atomic():
        campaign = Campaign.objects.create(name=f"overhead on {workload.reproducer}", parameters={
            "reproducers": [str(workload)], "detectors": [str(d) for d in detectors], "baseline": str(plain),
            "variants": ["fixed"], "pairs": pairs, "steps": steps})
        pairs_by_detector = {}
        for detector in detectors:
            pairs_by_detector[detector.name] = [
                tuple(Run.objects.create(campaign=campaign, reproducer_version=workload, detector=side,
                                         variant="fixed", seed=pair, steps=steps, queue=queue_for(workload))
                      for side in (plain, detector))
                for pair in range(pairs)]
    return campaign, pairs_by_detector


def do_measure_overhead(workload, detectors, plain, pairs=5, steps=None, write=None):
    """Run the overhead pairs in this process, one run at a time; return (campaign, records)."""
    campaign, pairs_by_detector = do_create_overhead_campaign(workload, detectors, plain, pairs, steps)
    records = []
    for detector in detectors:
        samples = []
        for pair, (base, instrumented) in enumerate(pairs_by_detector[detector.name]):
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
                write(f"  {detector.name} pair {pair + 1}/{pairs}: step x{samples[-1]['step_ratio']:.2f}, "
                      f"end to end x{samples[-1]['end_to_end_ratio']:.2f}")
        records.append(overhead_record(detector.name, samples, pairs))
    return campaign, records


def pair_sample(base, instrumented):
    base_step, step = steady_step_seconds(base.step_records), steady_step_seconds(instrumented.step_records)
    return {
        "step_ratio": step / base_step if step and base_step else None,
        "end_to_end_ratio": end_to_end_seconds(instrumented) / base.wall_seconds,
        "plain_step_seconds": base_step, "step_seconds": step,
        "plain_wall_seconds": base.wall_seconds, "wall_seconds": instrumented.wall_seconds,
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
