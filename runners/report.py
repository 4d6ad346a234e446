"""Parse a reproducer's report file (docs/reproducer-protocol.md) into plain data."""
import json
import math
from dataclasses import dataclass, field


@dataclass
class ParsedReport:
    start: dict | None = None
    steps: list = field(default_factory=list)
    oracle: dict | None = None
    alarms: list = field(default_factory=list)
    comparisons: list = field(default_factory=list)
    errors: list = field(default_factory=list)

    @property
    def trigger_step(self):
        return self.oracle.get("trigger_step") if self.oracle else None

    def trigger_time(self):
        """Unix time at which the trigger step began: the end of the step before it, on rank 0."""
        trigger = self.trigger_step
        if trigger is None:
            return None
        if trigger <= 0:
            return self.start.get("time") if self.start else None
        for record in self.steps:
            if record["step"] == trigger - 1 and record["rank"] == 0:
                return record.get("time")
        return None


MAX_ERRORS = 20
MAX_COMPARISONS = 10_000
MAX_COMPARED_VALUES = 64


def _number(value):
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _json_float(value):
    """JSON has no NaN/Inf: keep them as strings so they survive the database."""
    return value if value is None or math.isfinite(value) else str(value)


def _values(value):
    """A number or a short list of numbers as a list of floats (NaN/Inf kept), else None."""
    values = value if isinstance(value, list) else [value]
    if not values or len(values) > MAX_COMPARED_VALUES:
        return None
    # reproducers write non-finite numbers as null (JSON has none): a compared null is NaN
    numbers = [math.nan if v is None else float(v) if v in ("NaN", "Infinity", "-Infinity") else _number(v)
               for v in values]
    return None if any(n is None for n in numbers) else numbers


def _comparison(record):
    """A differential 'compare' record, or the reason it is malformed."""
    step, quantity = record.get("step"), record.get("quantity")
    if not isinstance(step, int) or not isinstance(quantity, str):
        return "compare record needs an integer 'step' and a string 'quantity'"
    value, reference = _values(record.get("value")), _values(record.get("reference"))
    if value is None or reference is None or len(value) != len(reference):
        return (f"compare record needs 'value' and 'reference' as numbers or equal-length lists of at most "
                f"{MAX_COMPARED_VALUES} numbers")
    return {"step": step, "rank": record.get("rank", 0) if isinstance(record.get("rank"), int) else 0,
            "quantity": quantity[:100], "value": value, "reference": reference, "time": _number(record.get("time"))}


def parse_report(text):
    report = ParsedReport()

    def error(message):
        if len(report.errors) < MAX_ERRORS:
            report.errors.append(message)

    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            error(f"line {number}: not JSON")
            continue
        if not isinstance(record, dict):
            error(f"line {number}: not a JSON object")
            continue
        event = record.get("event")
        if event == "start":
            report.start = record
        elif event == "step":
            step = record.get("step")
            if not isinstance(step, int):
                error(f"line {number}: step record without an integer 'step'")
                continue
            loss = _number(record.get("loss"))
            metrics = record.get("metrics") if isinstance(record.get("metrics"), dict) else {}
            report.steps.append({
                "step": step,
                "rank": record.get("rank", 0) if isinstance(record.get("rank"), int) else 0,
                "loss": _json_float(loss),
                "time": _number(record.get("time")),
                "metrics": {k: _json_float(_number(v)) for k, v in list(metrics.items())[:20]},
            })
        elif event == "oracle":
            if not isinstance(record.get("manifested"), bool):
                error(f"line {number}: oracle record without a boolean 'manifested'")
                continue
            if report.oracle is not None:
                error(f"line {number}: a second oracle record (the first one counts)")
                continue
            trigger = record.get("trigger_step")
            report.oracle = {
                "manifested": record["manifested"],
                "trigger_step": trigger if isinstance(trigger, int) else None,
                "summary": str(record.get("summary", ""))[:2000],
                "evidence": record.get("evidence") if isinstance(record.get("evidence"), dict) else {},
            }
        elif event == "alarm":
            step = record.get("step")
            if not isinstance(step, int):
                error(f"line {number}: alarm without an integer 'step'")
                continue
            report.alarms.append({
                "step": step,
                "rank": record.get("rank", 0) if isinstance(record.get("rank"), int) else 0,
                "rule": str(record.get("rule", ""))[:200],
                "message": str(record.get("message", ""))[:2000],
                "evidence": record.get("evidence") if isinstance(record.get("evidence"), dict) else {},
                "time": _number(record.get("time")),
            })
        elif event == "compare":
            comparison = _comparison(record)
            if isinstance(comparison, str):
                error(f"line {number}: {comparison}")
                continue
            if len(report.comparisons) < MAX_COMPARISONS:
                report.comparisons.append(comparison)
        else:
            error(f"line {number}: unknown event {event!r}")
    report.steps.sort(key=lambda r: (r["step"], r["rank"]))
    return report
