"""Differential reference check: the buggy computation against the same quantity computed another way.

"Add it two ways" (the silent-bugs essay): a reproducer that opts in computes a quantity twice, the
way under test and a reference way (eager vs compiled, parallel vs single device, accumulated vs
summed per micro-batch), and reports both as ``compare`` records (docs/reproducer-protocol.md). It
does the extra work only when ``SILENTBENCH_DIFFERENTIAL=1``, which this detector sets. An alarm is
raised at the first step where ``|value - reference| > atol + rtol * |reference|`` for any element
(NaN never matches), once per quantity and rank. Reproducers that do not opt in get no alarm: the
detector cannot see what it was not shown.
"""
import math

from .base import OPT_IN, DetectorPlugin, register


def mismatch(value, reference, rtol, atol):
    """The largest violation of the tolerance, or None when every element agrees."""
    worst = None
    for got, want in zip(value, reference):
        if math.isnan(got) or math.isnan(want):
            return math.inf
        error = abs(got - want) - (atol + rtol * abs(want))
        if error > 0 and (worst is None or error > worst):
            worst = error
    return worst


@register
class DifferentialReference(DetectorPlugin):
    name = "differential"
    version = "1"
    integration = OPT_IN  # it sees only what a reproducer written for it reports (compare records)
    description = ("Compares a quantity the reproducer computes two ways (opt-in compare records); alarms at the "
                   "first step where they disagree beyond atol + rtol * |reference|.")
    default_config = {"rtol": 1e-3, "atol": 1e-6}
    instruments = False

    def environment(self, config):
        return {"SILENTBENCH_DIFFERENTIAL": "1"}

    def analyze(self, context, report):
        config = self.config(context.config)
        context.summary["comparisons"] = len(report.comparisons)
        alarms, seen = [], set()
        for record in sorted(report.comparisons, key=lambda r: (r["step"], r["rank"])):
            key = (record["quantity"], record["rank"])
            if key in seen:
                continue
            excess = mismatch(record["value"], record["reference"], config["rtol"], config["atol"])
            if excess is None:
                continue
            seen.add(key)
            alarms.append({
                "step": record["step"], "rank": record["rank"], "rule": f"mismatch:{record['quantity']}",
                "message": (f"{record['quantity']} computed two ways disagrees beyond atol={config['atol']}, "
                            f"rtol={config['rtol']}"),
                "evidence": {"value": record["value"][:8], "reference": record["reference"][:8],
                             "excess": None if math.isinf(excess) else excess},
                "time": record["time"],
            })
        return alarms
