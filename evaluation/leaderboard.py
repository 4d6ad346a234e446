"""The leaderboard: one row per detector over the runs a selection takes (``evaluation.results.Results``: a stored
evaluation, a campaign, or every run the viewer may see), built from the same tables as the results page. Detectors
are ranked by the bugs they caught *beyond the fixed twin* (``evaluation.metrics.detected_beyond_clean``, counted in
the detection table). Drop-in detectors, which observe the unmodified program, are the headline and are ranked among
themselves; opt-in detectors, which catch a bug only when the reproducer cooperates (``differential`` reads the
reference the reproducer computes itself), are ranked apart, below, so that a program's help is never scored as
detection. ``plain`` is the baseline the overhead is measured against, shown apart and never ranked.

A detected buggy run that is not detected beyond the fixed twin is counted in one of two ways: *same rule on fixed*
when the fixed run of the same seed succeeded and every rule that fired on the buggy run also fired on it (the
detector does not tell the bug from its fix: noise), and *no fixed twin* when no fixed run of that seed succeeded, so
the detection cannot be told from the fix either way (a missing comparison, not noise)."""
from dataclasses import dataclass, field
from functools import cached_property
from urllib.parse import urlencode

from django.urls import reverse

from core.enums import Variant
from runners.detectors.base import DROP_IN, INTEGRATIONS

from .metrics import wilson_interval
from .results import Results
from .sensitivity import leaderboard_sensitivity
from .tables import integration_of

BASELINE = "plain"  # the detector whose runs the overhead pairs compare against (manage.py evaluate)
SELECTION = ("evaluation", "campaign", "device")  # the query parameters that choose the runs; no filter here


@dataclass
class Standing:
    """A detector's row: its bugs, false-positive rate, latency and overhead, and where the runs behind each are."""

    detector: str
    integration: str  # what it needs from the program: drop-in or opt-in (tables.integration_of)
    bugs: int = 0  # bugs with a buggy run under this detector
    caught: int = 0  # bugs with a detected buggy run
    beyond_fixed: int = 0  # bugs with a detection whose rule did not also fire on the fixed twin
    detected_runs: int = 0  # detected buggy runs, over all its bugs
    # of those, the runs not detected beyond the fixed twin, in two parts: every rule that fired also fired on the
    # fixed run of the same seed, which succeeded; and no fixed run of that seed succeeded. Both None for a stored
    # evaluation tabulated before the two were told apart (manage.py evaluate --retabulate splits them).
    same_rule_as_fixed_runs: int | None = 0
    no_fixed_twin_runs: int | None = 0
    false_positives: dict = field(default_factory=dict)  # its row of the false-positive table
    latency: dict = field(default_factory=dict)  # its row of the latency table
    overhead: dict = field(default_factory=dict)  # its row of the overhead table
    links: dict = field(default_factory=dict)  # cell name -> URL of the runs (or the table) behind it
    # its cell of the latest sensitivity evaluation (evaluation.sensitivity.leaderboard_sensitivity): never ranked
    sensitivity: dict = field(default_factory=dict)
    rank: int | None = None  # None for the baseline; opt-in detectors have ranks of their own

    @property
    def beyond_fixed_interval(self):
        """The Wilson 95% interval of the share of its bugs caught beyond the fixed twin (None without bugs): with
        32 bugs, 9/32 is anywhere from 0.16 to 0.45, which says how far apart two ranks really are."""
        if not self.bugs:
            return None
        low, high = wilson_interval(self.beyond_fixed, self.bugs)
        return round(self.beyond_fixed / self.bugs, 3), round(low, 3), round(high, 3)

    @property
    def registered(self):
        """Whether its plugin is still registered (else it is ranked with the opt-in detectors, apart)."""
        return self.integration in INTEGRATIONS


@dataclass
class Leaderboard:
    results: Results
    ranked: list  # the drop-in detectors: the headline
    opt_in: list  # every other detector, ranked apart
    baseline: Standing | None
    sensitivity_evaluation: object = None  # the latest SensitivityEvaluation, whose cells the rows carry

    @property
    def evaluation(self):
        return self.results.evaluation

    @property
    def campaign_id(self):
        return self.results.campaign_id

    def runs_summary(self):
        """How many runs the selection holds, which seeds and which environments ran them."""
        return self.results.runs_summary()

    @cached_property
    def folded(self):
        """{column: why it is folded away}: the columns that say nothing on these rows (every value the same as
        another column's, or missing), which the page leaves out and names."""
        rows = [*self.ranked, *self.opt_in]
        found = {}
        if rows and all(row.caught == row.beyond_fixed for row in rows):
            found["caught"] = "bugs caught (on every row the same as beyond the fixed twin)"
        if rows and all(row.same_rule_as_fixed_runs == 0 and row.no_fixed_twin_runs == 0 for row in rows):
            found["split"] = "the detected runs not beyond the fixed twin (none on any row)"
        if all(row.false_positives.get("per_check_fp_rate") is None for row in [*rows, *filter(None, [self.baseline])]):
            found["per_check"] = "the per-check FP rate (no detector here reports its rules)"
        return found


def selection_query(query):
    """The part of a query string that chooses the runs (``?evaluation=``, ``?campaign=`` or ``?device=``)."""
    return {name: query[name] for name in SELECTION if query.get(name)}


def build_leaderboard(query, user, stored_only=False):
    """The leaderboard of the runs ``query`` selects, as ``user`` may see them (NotFound as for the results). With
    ``stored_only``, None unless it selects a stored evaluation (the live tables judge every run they cover)."""
    results = Results(selection_query(query), user)
    if stored_only and results.evaluation is None:
        return None
    ranked, opt_in, baseline = results.cached("leaderboard", lambda: _ranked(results))
    sensitivity_evaluation, cells = leaderboard_sensitivity()
    for standing in [*ranked, *opt_in]:
        standing.sensitivity = cells.get(standing.detector, {})
    return Leaderboard(results, ranked, opt_in, baseline, sensitivity_evaluation)


def _ranked(results):
    """(the ranked drop-in standings, the opt-in ones ranked apart, the baseline's or None) of ``results``' tables,
    with their links."""
    by_detector = standings(*(results.table(name).to_dict("records")
                              for name in ("detection", "false-positives", "latency", "overhead")))
    for name, standing in by_detector.items():
        standing.links = _links(results, name)
    baseline = by_detector.pop(BASELINE)
    ranked, opt_in = grouped(by_detector.values())
    return ranked, opt_in, baseline if _has_data(baseline) or ranked or opt_in else None


def grouped(standings_):
    """(the drop-in standings, every other one), each ranked among themselves (``ranking``): an opt-in detector
    never takes a rank from a drop-in one, however many bugs its reproducers' help lets it catch."""
    standings_ = list(standings_)
    return (ranking(s for s in standings_ if s.integration == DROP_IN),
            ranking(s for s in standings_ if s.integration != DROP_IN))


def ranking(standings_):
    """The standings in leaderboard order, each with its rank: by bugs caught beyond the fixed twin (ties share
    a rank), then, within a tie, by bugs caught, the false-positive rate and the name."""
    ranked = sorted(standings_, key=lambda s: (-s.beyond_fixed, -s.caught, _fp_rate(s), s.detector))
    for position, standing in enumerate(ranked, start=1):
        previous = ranked[position - 2] if position > 1 else None
        tied = previous is not None and previous.beyond_fixed == standing.beyond_fixed
        standing.rank = previous.rank if tied else position
    return ranked


def standings(detection, false_positives, latency, overhead):
    """{detector: Standing} from the records of the four tables (the baseline included, links left empty)."""
    by_table = [{row["detector"]: row for row in records} for records in (false_positives, latency, overhead)]
    found = {}
    for name in {row["detector"] for row in detection}.union(*by_table, {BASELINE}):
        rows = [row for row in detection if row["detector"] == name]
        same_rule, no_twin = _not_beyond_fixed(rows)
        found[name] = Standing(
            name, integration=integration_of(name), bugs=len({row["bug"] for row in rows if row["buggy_runs"]}),
            caught=len({row["bug"] for row in rows if row["detected_runs"]}),
            beyond_fixed=len({row["bug"] for row in rows if row.get("detected_beyond_fixed_runs")}),
            detected_runs=sum(row["detected_runs"] or 0 for row in rows),
            same_rule_as_fixed_runs=same_rule, no_fixed_twin_runs=no_twin,
            false_positives=by_table[0].get(name, {}), latency=by_table[1].get(name, {}),
            overhead=by_table[2].get(name, {}))
    return found


def _not_beyond_fixed(rows):
    """(same rule as fixed, no fixed twin): a detector's detected runs not detected beyond the fixed twin, split by
    whether the twin succeeded; (None, None) when a row was stored before the detection table counted the runs
    without a twin."""
    if any(row.get("detected_without_fixed_twin_runs") is None for row in rows):
        return None, None
    no_twin = sum(row["detected_without_fixed_twin_runs"] for row in rows)
    not_beyond = sum((row["detected_runs"] or 0) - (row.get("detected_beyond_fixed_runs") or 0) for row in rows)
    return not_beyond - no_twin, no_twin


def _fp_rate(standing):
    rate = standing.false_positives.get("fp_rate")
    return 1.0 if rate is None else rate


def _has_data(standing):
    return bool(standing.bugs or standing.false_positives)


def _links(results, detector):
    """Where the runs behind each of a detector's numbers are listed: the run list page (evaluation.run_lists) of
    the selection's succeeded runs of the detector, narrowed to what the number counts (its detections, its
    false alarms), and the results page for the numbers that come from its tables (latency)."""
    campaign = results.evaluation.campaign_id if results.evaluation else results.campaign_id
    selection = ({"evaluation": results.evaluation.pk} if results.evaluation
                 else {"campaign": campaign} if campaign else {})
    table = reverse("evaluation:results") + "?" + urlencode({**selection, "detector": detector})
    listed = reverse("evaluation:runs") + "?" + urlencode({**selection, "detector": detector})
    links = {
        "detected_runs": listed + "&" + urlencode({"variant": Variant.BUGGY, "verdict": "detected"}),
        "clean_runs": listed + "&" + urlencode({"variant": Variant.FIXED}),
        "false_alarm_runs": listed + "&" + urlencode({"variant": Variant.FIXED, "verdict": "false-alarm"}),
        "matrix": table + "#detection-matrix", "latency": table + "#latency",
    }
    if results.evaluation and results.evaluation.overhead_campaign_id:
        links["overhead_runs"] = reverse("evaluation:runs") + "?" + urlencode(
            {"campaign": results.evaluation.overhead_campaign_id, "detector": detector})
    return links
