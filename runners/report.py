"""Parse a reproducer's report file (docs/reproducer-protocol.md) into plain data.

Only alarms signed with the run's key count (the detector's probe signs them, runners.detectors.base); a run
keeps a bounded number of records of each kind; and every value comes out as JSON any database stores
(``json_safe``).

The report reaches the worker in the order it was written (a FIFO in a sealed run), so each alarm also gets the
step its rank had completed when the alarm arrived (``arrival_step``: the highest step of that rank's step records
before it, -1 before the first; of any rank's, for a rank that writes no step records). That is the worker's
reading, not the detector's: an alarm raised after training, or dated to a step long before it arrived, is seen as
such (evaluation.metrics)."""
import hmac
import json
import math
from dataclasses import dataclass, field

from .detectors.base import alarm_mac
from .failures import too_many_records

MAX_ERRORS = 20
MAX_STEPS = 10_000
MAX_ALARMS = 2_000  # ten processes at the probe's own limit (Probe.max_alarms)
MAX_COMPARISONS = 10_000
MAX_COMPARED_VALUES = 64
NON_FINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}  # how they are stored


@dataclass(frozen=True)
class RecordCaps:
    """How many records of each kind a run keeps; past a cap the rest are dropped and the run fails."""

    max_steps: int = MAX_STEPS
    max_alarms: int = MAX_ALARMS
    max_comparisons: int = MAX_COMPARISONS


@dataclass
class ParsedReport:
    start: dict | None = None
    steps: list = field(default_factory=list)
    oracle: dict | None = None
    alarms: list = field(default_factory=list)
    comparisons: list = field(default_factory=list)
    errors: list = field(default_factory=list)
    refused_alarms: int = 0  # alarm records without a valid signature: not the detector's
    over_cap: str = ""  # what went past a RecordCaps cap, as the run's failure reason (too_many_records)

    @property
    def trigger_step(self):
        return self.oracle.get("trigger_step") if self.oracle else None

    def trigger_time(self):
        """Unix time at which the trigger step began: the end of the step before it, on rank 0."""
        trigger = self.trigger_step
        if trigger is None:
            return None
        if trigger <= 0:
            return _finite(self.start.get("time")) if self.start else None
        for record in self.steps:
            if record["step"] == trigger - 1 and record["rank"] == 0:
                return record.get("time")
        return None


def json_safe(value):
    """``value`` as JSON every database stores: NaN, Infinity and -Infinity become the strings "NaN",
    "Infinity" and "-Infinity" at any depth, NUL characters (which PostgreSQL refuses) U+FFFD, keys strings,
    tuples lists, and anything JSON has no type for its ``str()``."""
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        return "NaN" if math.isnan(value) else "Infinity" if value > 0 else "-Infinity"
    if value is None or isinstance(value, (bool, int)):
        return value
    if isinstance(value, dict):
        return {json_safe(str(key)): json_safe(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(item) for item in value]
    # lone surrogates (which no database encodes) and NUL become U+FFFD
    return str(value).encode("utf-8", "replace").decode("utf-8").replace("\x00", "\ufffd")


def _number(value):
    """A JSON number as a float (an integer too large for one as +-Infinity), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf


def _finite(value):
    """A finite number as a float, else None (a time that is not one)."""
    number = _number(value)
    return number if number is not None and math.isfinite(number) else None


def _rank(record):
    return record.get("rank", 0) if isinstance(record.get("rank"), int) else 0


def _values(value):
    """A number or a short list of numbers as a list of floats (NaN/Inf kept), else None."""
    values = value if isinstance(value, list) else [value]
    if not values or len(values) > MAX_COMPARED_VALUES:
        return None
    # reproducers write non-finite numbers as null (JSON has none): a compared null is NaN
    numbers = [math.nan if v is None else NON_FINITE.get(v) if isinstance(v, str) else _number(v) for v in values]
    return None if any(n is None for n in numbers) else numbers


def _comparison(record):
    """A differential 'compare' record, or the reason it is malformed. Its values stay floats (NaN and Inf
    included) for the differential detector; they are stored only through its alarms."""
    step, quantity = record.get("step"), record.get("quantity")
    if not isinstance(step, int) or not isinstance(quantity, str):
        return "compare record needs an integer 'step' and a string 'quantity'"
    value, reference = _values(record.get("value")), _values(record.get("reference"))
    if value is None or reference is None or len(value) != len(reference):
        return (f"compare record needs 'value' and 'reference' as numbers or equal-length lists of at most "
                f"{MAX_COMPARED_VALUES} numbers")
    return {"step": step, "rank": _rank(record), "quantity": quantity[:100], "value": value,
            "reference": reference, "time": _finite(record.get("time"))}


def _signed(record, alarm_key):
    """Whether an alarm record carries a valid signature under ``alarm_key`` (never, without a key)."""
    mac = record.pop("mac", None)
    return alarm_key is not None and hmac.compare_digest(str(mac).encode(), alarm_mac(alarm_key, record).encode())


def parse_report(text, alarm_key=None, caps=None):
    """The report file's records as plain, storable data. ``alarm_key``: the run's key (hex), which every
    alarm record must be signed with to count; ``caps``: a RecordCaps (the defaults above when None)."""
    caps = caps or RecordCaps()
    # completed: {rank: its highest step record so far}; progress: that, as each kept alarm arrived
    report, seen = ParsedReport(), {"step": 0, "alarm": 0, "compare": 0, "completed": {}, "progress": []}
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except (ValueError, RecursionError):  # also integers past Python's digit limit, nesting past its depth
            problem = "not JSON"
        else:
            try:
                problem = _take(report, record, alarm_key, caps, seen)
            except RecursionError:
                problem = "nested too deeply"
        if problem and len(report.errors) < MAX_ERRORS:
            report.errors.append(f"line {number}: {problem}")
    report.steps.sort(key=lambda r: (r["step"], r["rank"]))
    stepping = {record["rank"] for record in report.steps}
    for alarm, completed in zip(report.alarms, seen["progress"]):  # its rank's progress as it arrived
        alarm["arrival_step"] = (completed.get(alarm["rank"], -1) if alarm["rank"] in stepping
                                 else max(completed.values(), default=-1))
    report.over_cap = " ".join(too_many_records(what, seen[what], cap) for what, cap in (
        ("step", caps.max_steps), ("alarm", caps.max_alarms), ("compare", caps.max_comparisons)) if seen[what] > cap)
    return report


def _take(report, record, alarm_key, caps, seen):
    """Add one record to ``report`` (``seen`` counts the records of each kind); what is wrong with it, if anything."""
    if not isinstance(record, dict):
        return "not a JSON object"
    event = record.get("event")
    if event == "start":
        report.start = json_safe(record)
    elif event == "step":
        if not isinstance(record.get("step"), int):
            return "step record without an integer 'step'"
        seen["step"] += 1
        if seen["step"] <= caps.max_steps:
            metrics = record.get("metrics") if isinstance(record.get("metrics"), dict) else {}
            completed = seen["completed"]
            completed[_rank(record)] = max(completed.get(_rank(record), -1), record["step"])
            report.steps.append(json_safe({
                "step": record["step"],
                "rank": _rank(record),
                "loss": _number(record.get("loss")),
                "time": _finite(record.get("time")),
                "metrics": {k: _number(v) for k, v in list(metrics.items())[:20]},
            }))
    elif event == "oracle":
        if not isinstance(record.get("manifested"), bool):
            return "oracle record without a boolean 'manifested'"
        if report.oracle is not None:
            return "a second oracle record (the first one counts)"
        trigger = record.get("trigger_step")
        report.oracle = json_safe({
            "manifested": record["manifested"],
            "trigger_step": trigger if isinstance(trigger, int) else None,
            "summary": str(record.get("summary", ""))[:2000],
            "evidence": record.get("evidence") if isinstance(record.get("evidence"), dict) else {},
        })
    elif event == "alarm":
        if not _signed(record, alarm_key):
            report.refused_alarms += 1
        elif not isinstance(record.get("step"), int):
            return "alarm without an integer 'step'"
        else:
            seen["alarm"] += 1
            if seen["alarm"] <= caps.max_alarms:
                report.alarms.append(json_safe({
                    "step": record["step"],
                    "rank": _rank(record),
                    "rule": str(record.get("rule", ""))[:200],
                    "message": str(record.get("message", ""))[:2000],
                    "evidence": record.get("evidence") if isinstance(record.get("evidence"), dict) else {},
                    "time": _finite(record.get("time")),
                    "detector": str(record.get("detector", ""))[:64],  # the probe's: a bundle's member (execution)
                }))
                seen["progress"].append(dict(seen["completed"]))
    elif event == "compare":
        comparison = _comparison(record)
        if isinstance(comparison, str):
            return comparison
        seen["compare"] += 1
        if seen["compare"] <= caps.max_comparisons:
            report.comparisons.append(comparison)
    else:
        return f"unknown event {event!r}"
    return None
