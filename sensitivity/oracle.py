"""The sensitivity track's oracle, by construction and calibrated against noise.

A mutant's run has **manifested** when one of its outcomes differs from the clean twin's (the same pipeline, seed and
steps, no fault) by more than the pipeline's seed-to-seed spread of that outcome: the ``quantile`` of the
differences between clean runs of distinct seeds. A mutant whose outcomes all stay within it is **benign** on that
seed: its fault changed nothing a user could tell from noise, and it counts neither as a miss nor as a detection.

The outcomes are the ones every pipeline reports in its oracle record's evidence (catalog/pipelines): the final loss
(the mean loss of the last quarter of the steps), the held-out metric where the pipeline has one (accuracy), and, for
the DDP pipeline, the largest difference between the replicas. Where a pipeline states its own tolerance for an
outcome (the DDP pipeline's replicas may differ by 1e-6 before its own oracle calls them diverged), the threshold is
never below it: clean replicas are identical on every seed, so their spread alone would count a difference of one
rounding error. A non-finite outcome where the twin's is finite has always manifested.
"""
import itertools
import math
from dataclasses import dataclass
from typing import Any

OUTCOMES = {  # outcome -> (the evidence key that holds it, in words)
    "final_loss": ("last_quarter_mean_loss", "final loss"),
    "heldout_metric": ("heldout_acc", "held-out accuracy"),
    "replica_difference": ("replica_max_abs_diff", "largest difference between replicas"),
}
TOLERANCES = {"replica_difference": "replica_tolerance"}  # outcome -> the evidence key of the pipeline's tolerance
DEFAULT_QUANTILE = 0.9


def outcomes(evidence: dict[str, Any]) -> dict[str, float]:
    """The outcomes an oracle record's evidence holds; a non-finite one (stored as null or a string) is NaN."""
    found = {}
    for outcome, (key, _) in OUTCOMES.items():
        if key not in evidence:
            continue
        value = evidence[key]
        finite = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        found[outcome] = float(value) if finite else math.nan
    return found


def tolerances(evidence: dict[str, Any]) -> dict[str, float]:
    """The tolerances a pipeline's oracle record states for its outcomes (TOLERANCES)."""
    return {outcome: float(evidence[key]) for outcome, key in TOLERANCES.items()
            if isinstance(evidence.get(key), (int, float)) and not isinstance(evidence.get(key), bool)}


def quantile(values: list[float], q: float) -> float:
    """The ``q`` quantile of ``values``, linearly interpolated (numpy's default)."""
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


@dataclass(frozen=True)
class Calibration:
    """A pipeline's noise: per outcome, the threshold (the quantile of clean-vs-clean differences) and how many
    pairs of seeds it was measured on."""

    quantile: float
    thresholds: dict[str, float]
    pairs: int
    seeds: tuple[int, ...]

    def as_dict(self) -> dict[str, Any]:
        return {"quantile": self.quantile, "thresholds": self.thresholds, "pairs": self.pairs,
                "seeds": list(self.seeds)}


def calibrate(clean_by_seed: dict[int, dict[str, float]], q: float = DEFAULT_QUANTILE,
              floors: dict[str, float] | None = None) -> Calibration:
    """The thresholds from clean runs of one pipeline, one per seed; at least three seeds with finite outcomes. A
    threshold is never below the pipeline's own tolerance for that outcome (``floors``)."""
    finite = {seed: values for seed, values in clean_by_seed.items()
              if values and all(math.isfinite(value) for value in values.values())}
    if len(finite) < 3:
        raise ValueError(f"calibration needs clean runs of at least 3 seeds with finite outcomes, not {len(finite)}")
    names = sorted(set.intersection(*(set(values) for values in finite.values())))
    pairs = list(itertools.combinations(sorted(finite), 2))
    thresholds = {name: max(quantile([abs(finite[a][name] - finite[b][name]) for a, b in pairs], q),
                            (floors or {}).get(name, 0.0)) for name in names}
    return Calibration(q, thresholds, len(pairs), tuple(sorted(finite)))


@dataclass(frozen=True)
class Verdict:
    manifested: bool
    moved: list[dict[str, Any]]  # each outcome that moved: name, mutant, twin, difference, threshold
    summary: str

    @property
    def benign(self) -> bool:
        return not self.manifested


def judge(mutant: dict[str, float], twin: dict[str, float], calibration: Calibration) -> Verdict:
    """Whether the mutant's outcomes moved beyond the pipeline's noise from its clean twin's, and which did."""
    moved: list[dict[str, Any]] = []
    for name, threshold in sorted(calibration.thresholds.items()):
        if name not in mutant or name not in twin or not math.isfinite(twin[name]):
            continue
        value, reference = mutant[name], twin[name]
        difference = math.inf if not math.isfinite(value) else abs(value - reference)
        if difference > threshold:
            moved.append({"outcome": name, "mutant": value, "twin": reference, "difference": difference,
                          "threshold": threshold})
    if not moved:
        return Verdict(False, [], f"benign: no outcome moved beyond the clean seed-to-seed spread "
                                  f"(q={calibration.quantile:g} over {calibration.pairs} pairs)")
    words = "; ".join(
        f"{OUTCOMES[item['outcome']][1]} {_number(item['twin'])} -> {_number(item['mutant'])} "
        f"(|difference| {_number(item['difference'])} > {_number(item['threshold'])})" for item in moved)
    return Verdict(True, moved, f"manifested: {words}")


def _number(value: float) -> str:
    return f"{value:.4g}" if math.isfinite(value) else "not finite"
