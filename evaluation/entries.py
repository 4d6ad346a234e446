"""The open leaderboard: one entry per approved detector version, scored by SilentBench's own workers on the corpus,
whoever wrote it (runners.actions.detector_versions.do_start_scoring: approval starts a scoring campaign over every
CPU reproducer and clean pipeline at the published evaluation's seeds; ``manage.py rescore`` starts one again on the
current corpus).

An entry's numbers come from one campaign, the newest completed scoring campaign of that exact version (its code
hash); a built-in version that has none is scored by the published evaluation, the newest stored one, whose runs
record the built-in detectors. The same tables as the results page give the numbers (``leaderboard.standings``),
and the held-out split gives the public and the held-out scores apart (``held_out.held_out_scores``): no one but a
maintainer sees which held-out bugs an entry caught, only how many. Entries are ranked as the leaderboard ranks
detectors: drop-in ones by public bugs caught beyond the fixed twin, then held-out ones, bugs caught, the
false-positive rate and the name; opt-in ones apart; ``plain`` is the baseline, never ranked. A submitted version
whose runs show that its alarms follow the label or the program's verdict, not the program (evaluation.integrity),
is flagged: it keeps its entry, unranked, with the runs behind the finding for the maintainers."""
from dataclasses import dataclass, field
from urllib.parse import urlencode

import pandas as pd
from django.db.models import Max, Q
from django.urls import reverse

from bugs.permissions import sees_unreviewed
from core.enums import ReviewState
from core.exports import Table
from runners.detector_versions.registry import config_hash
from runners.detectors.base import DROP_IN
from runners.models import Campaign, CampaignPurpose, Detector, DetectorVersion, Run
from runners.scoring import TWIN_CONFIG
from runners.selectors import visible_campaigns, visible_runs

from .exports import WILSON
from .held_out import Split, held_out_scores
from .integrity import Integrity, integrity_of
from .leaderboard import BASELINE, Standing, standings
from .results import Results, latest_evaluation, results_viewer
from .sensitivity import entry_sensitivity, leaderboard_sensitivity


@dataclass
class Entry:
    """One approved detector version's standing, where its numbers come from and how to cite them."""

    version: DetectorVersion
    campaign: Campaign  # the campaign whose runs scored it
    evaluation: object  # the stored evaluation that scored it (a built-in without a scoring campaign), or None
    standing: Standing
    public: Split
    held_out: Split
    held_out_total: int
    summary: dict  # Results.runs_summary of the scoring runs: runs, seeds, torch releases, hosts
    recorded_code: bool  # the scoring runs recorded this exact code (False: runs older than code hashes)
    integrity: Integrity | None = None  # what its runs show of it, a submitted version's (evaluation.integrity)
    rank: int | None = None
    links: dict = field(default_factory=dict)
    sensitivity: dict = field(default_factory=dict)  # its cell of the latest sensitivity evaluation (never ranked)

    @property
    def name(self):
        return self.version.name

    @property
    def integration(self):
        """Drop-in or opt-in, as the version's code declares it (read from its syntax tree when it was recorded)."""
        return self.version.interface.get("integration") or self.standing.integration

    @property
    def submitter(self):
        return "SilentBench (built-in)" if self.version.builtin else (
            self.version.submitted_by.get_username() if self.version.submitted_by else "a deleted account")

    @property
    def flagged(self):
        """Why it is kept out of the ranking (evaluation.integrity), one sentence each; [] when it is ranked."""
        return self.integrity.reasons if self.integrity is not None else []

    @property
    def scored_at(self):
        return self.campaign.completed_at

    def citation(self):
        """One line that names exactly what was scored, on what and where: the detector's code hash, the campaign,
        the seeds and the environment."""
        source = (f"evaluation #{self.evaluation.pk}, campaign #{self.campaign.pk}" if self.evaluation
                  else f"scoring campaign #{self.campaign.pk}")
        code = f"code sha256 {self.version.code_hash[:16]}" if self.recorded_code else "code recorded before hashes"
        seeds = ",".join(map(str, self.summary.get("seeds", []))) or "-"
        torch = ", ".join(self.summary.get("torch", [])) or "not recorded"
        date = self.scored_at.date().isoformat() if self.scored_at else "not completed"
        return (f"{self.name} {self.version.version} ({self.submitter}): SilentBench open leaderboard, {source}, "
                f"scored {date}, {code}, seeds {seeds}, torch {torch}.")


def scoring_campaigns(versions, user):
    """{detector version id: its newest completed scoring campaign that ``user`` may see} for ``versions``. The
    trusted twins a scoring campaign runs under ``plain`` do not make it ``plain``'s (runners.scoring.TWIN_CONFIG)."""
    records = Detector.objects.filter(code__in=versions).exclude(name=BASELINE, config_hash=config_hash(TWIN_CONFIG))
    newest = (visible_campaigns(user).filter(purpose=CampaignPurpose.SCORING, completed_at__isnull=False,
                                             runs__detector__in=records)
              .values("runs__detector__code").annotate(newest=Max("id")))
    by_id = Campaign.objects.in_bulk([row["newest"] for row in newest])
    return {row["runs__detector__code"]: by_id[row["newest"]] for row in newest}


def open_entries(user):
    """(the ranked drop-in entries, the opt-in ones ranked apart, the baseline's entry or None) of every approved
    detector version with a completed scoring: each version's newest completed scoring campaign, or for a built-in
    without one, the published evaluation, if its runs recorded that exact code (or, for runs recorded before code
    hashes, no code: then the newest built-in version of that name, marked so)."""
    approved = list(DetectorVersion.objects.filter(review_state=ReviewState.APPROVED)
                    .select_related("submitted_by").order_by("name", "-created_at", "-id"))
    campaigns = scoring_campaigns(approved, user)
    evaluation = latest_evaluation(results_viewer(user))
    recorded = {}  # detector name -> the DetectorVersion ids (None: no code recorded) the evaluation's runs name
    if evaluation is not None:
        for name, code in (Run.objects.filter(campaign=evaluation.campaign_id).order_by()
                           .values_list("detector__name", "detector__code").distinct()):
            recorded.setdefault(name, set()).add(code)
    newest_builtin = {}
    for version in approved:
        if version.builtin:
            newest_builtin.setdefault(version.name, version)
    entries = []
    for version in approved:
        codes = recorded.get(version.name, set())
        if version.pk in campaigns:
            entry = _entry(version, {"campaign": str(campaigns[version.pk].pk)}, campaigns[version.pk], None, user,
                           recorded_code=True)
        elif version.builtin and version.pk in codes:
            entry = _entry(version, {"evaluation": str(evaluation.pk)}, evaluation.campaign, evaluation, user,
                           recorded_code=True)
        elif version.builtin and codes == {None} and newest_builtin[version.name] is version:
            entry = _entry(version, {"evaluation": str(evaluation.pk)}, evaluation.campaign, evaluation, user,
                           recorded_code=False)
        else:
            entry = None
        if entry is not None:
            entries.append(entry)
    sensitivity_evaluation, cells = leaderboard_sensitivity()  # mutants, never part of the rank
    for entry in entries:
        entry.sensitivity = entry_sensitivity(entry.version, sensitivity_evaluation, cells)
    baseline = next((entry for entry in entries if entry.name == BASELINE), None)
    others = [entry for entry in entries if entry.name != BASELINE]
    return (_ranking([e for e in others if e.integration == DROP_IN]),
            _ranking([e for e in others if e.integration != DROP_IN]), baseline)


def _entry(version, selection, campaign, evaluation, user, recorded_code):
    """The entry of ``version`` scored by the runs ``selection`` takes (a scoring campaign, or an evaluation), or
    None when they hold no run of it. ``recorded_code``: whether those runs recorded this exact code."""
    results = Results(selection, user)
    by_detector = standings(*(results.table(name).to_dict("records")
                              for name in ("detection", "false-positives", "latency", "overhead")))
    standing = by_detector.get(version.name)
    if standing is None or not (standing.bugs or standing.false_positives):
        return None
    scores = held_out_scores(results)
    public, held_out = scores.of(version.name)
    integrity = None if version.builtin else integrity_of(results.judged, version.name)
    entry = Entry(version, campaign, evaluation, standing, public, held_out, scores.held_out_total,
                  results.runs_summary(), recorded_code=recorded_code, integrity=integrity)
    entry.links = {
        "campaign": campaign.get_absolute_url(),
        "runs": reverse("evaluation:runs") + "?" + urlencode({"campaign": campaign.pk, "detector": version.name}),
        "entry": reverse("leaderboard-entry", args=[version.pk]),
        "history": reverse("detector", args=[version.name]),
    }
    return entry


def _ranking(entries):
    """The entries in leaderboard order, each with its rank (ties on the public score and the held-out one share
    it): public bugs caught beyond the fixed twin, held-out ones, bugs caught, the false-positive rate, the name.
    Flagged entries come last, unranked (rank None)."""
    def fp_rate(entry):
        rate = entry.standing.false_positives.get("fp_rate")
        return 1.0 if rate is None else rate

    ranked = sorted((entry for entry in entries if not entry.flagged),
                    key=lambda e: (-e.public.beyond_fixed, -e.held_out.beyond_fixed, -e.public.caught,
                                   fp_rate(e), e.name, e.version.version))
    for position, entry in enumerate(ranked, start=1):
        previous = ranked[position - 2] if position > 1 else None
        tied = previous is not None and (previous.public.beyond_fixed, previous.held_out.beyond_fixed) == (
            entry.public.beyond_fixed, entry.held_out.beyond_fixed)
        entry.rank = previous.rank if tied else position
    return ranked + sorted((entry for entry in entries if entry.flagged), key=lambda e: (e.name, e.version.version))


def detector_history(name, user):
    """Every version of the detector ``name`` that ``user`` may see, newest first, with its entry where it has one:
    [(DetectorVersion, Entry or None)]. Approved versions are public; pending and rejected ones are seen by their
    submitter and the maintainers."""
    versions = DetectorVersion.objects.filter(name=name).select_related("submitted_by")
    if not sees_unreviewed(user):
        mine = Q(submitted_by=user) if user.is_authenticated else Q(pk__in=[])
        versions = versions.filter(Q(review_state=ReviewState.APPROVED) | mine)
    ranked, opt_in, baseline = open_entries(user)
    by_version = {entry.version.pk: entry for entry in [*ranked, *opt_in, *([baseline] if baseline else [])]}
    return [(version, by_version.get(version.pk)) for version in versions.order_by("-created_at", "-id")]


def entry_of(version_pk, user):
    """The entry of one approved detector version, or None when it has no completed scoring yet."""
    ranked, opt_in, baseline = open_entries(user)
    return next((entry for entry in [*ranked, *opt_in, *([baseline] if baseline else [])]
                 if entry.version.pk == version_pk), None)


def scored_versions(entry, user):
    """What the entry was scored on, for its manifest: ([(bug ID or "clean pipeline", reproducer, content hash)] of
    the reproducer versions its runs used that ``user`` may see, how many others it ran: held out or unreviewed)."""
    runs = Run.objects.filter(campaign=entry.campaign, detector__name=entry.name)
    shown = (visible_runs(user, runs).order_by().values_list(
        "reproducer_version__reproducer__bug__bug_id", "reproducer_version__reproducer__name",
        "reproducer_version__content_hash").distinct())
    rows = sorted({(bug or "clean pipeline", reproducer, content_hash) for bug, reproducer, content_hash in shown})
    total = runs.order_by().values("reproducer_version").distinct().count()
    return rows, total - len(rows)



ENTRIES_CAPTION = (
    "The SilentBench open leaderboard: one row per approved detector version, scored by SilentBench's workers on every "
    "CPU reproducer and clean pipeline (its newest completed scoring campaign, or for a built-in detector without one, "
    "the published evaluation). Ranked by the public bugs caught beyond the fixed twin (an alarm at or after the "
    "trigger step whose rule did not also fire on the fixed variant of the same seed), then the held-out bugs caught "
    "beyond it, of those scored after they were held out; the false-positive rate per clean run with its Wilson 95% "
    "interval; the median latency in steps; the median step-time ratio to plain where an evaluation timed it. Drop-in "
    "detectors first, opt-in ones ranked apart; plain is the baseline.")


def entries_export(user=None):
    """The open leaderboard as a table (core.exports.Table), for downloads and ``manage.py export entries``."""
    ranked, opt_in, baseline = open_entries(user)
    rows = []
    for entry in [*ranked, *opt_in, *([baseline] if baseline else [])]:
        fp, standing = entry.standing.false_positives, entry.standing
        rows.append({
            "rank": ("baseline" if entry.name == BASELINE else "flagged" if entry.flagged else entry.rank),
            "detector": entry.name,
            "version": entry.version.version, "submitter": entry.submitter, "integration": entry.integration,
            "public_beyond_fixed": entry.public.beyond_fixed, "public_bugs": entry.public.bugs,
            "held_out_beyond_fixed": entry.held_out.beyond_fixed, "held_out_bugs": entry.held_out_total,
            "fp_rate": fp.get("fp_rate"), "fp_ci_low": fp.get("fp_ci_low"), "fp_ci_high": fp.get("fp_ci_high"),
            "median_latency_steps": standing.latency.get("median_latency_steps"),
            "median_step_time_ratio": standing.overhead.get("median_step_time_ratio"),
            "campaign": entry.campaign.pk, "evaluation": entry.evaluation.pk if entry.evaluation else None,
            "scored": entry.scored_at.date().isoformat() if entry.scored_at else None,
            "code_sha256": entry.version.code_hash if entry.recorded_code else None,
            "citation": entry.citation(),
        })
    frame = pd.DataFrame(rows, columns=ENTRY_COLUMNS, dtype=object)
    paper = frame.assign(**{
        "public": [f"{b}/{n}" for b, n in zip(frame["public_beyond_fixed"], frame["public_bugs"])],
        "held out": [f"{b}/{n}" if n else "--" for b, n in zip(frame["held_out_beyond_fixed"],
                                                                frame["held_out_bugs"])],
    })[["rank", "detector", "version", "submitter", "public", "held out", "fp_rate", "fp_ci_low", "fp_ci_high",
        "median_latency_steps", "median_step_time_ratio", "campaign"]].rename(columns=ENTRY_HEADERS)
    return Table("open-leaderboard", frame, caption=ENTRIES_CAPTION, paper=paper, intervals=WILSON,
                 align={"submitter": "p{2.6cm}"})


ENTRY_COLUMNS = ["rank", "detector", "version", "submitter", "integration", "public_beyond_fixed", "public_bugs",
                 "held_out_beyond_fixed", "held_out_bugs", "fp_rate", "fp_ci_low", "fp_ci_high",
                 "median_latency_steps", "median_step_time_ratio", "campaign", "evaluation", "scored", "code_sha256",
                 "citation"]
# the LaTeX headers of the paper's columns (the Wilson interval's keep their names: core.exports prints them as one)
ENTRY_HEADERS = {
    "rank": "rank", "detector": "detector", "version": "version", "submitter": "submitter",
    "integration": "integration", "public_beyond_fixed": "public beyond fixed", "public_bugs": "public bugs",
    "held_out_beyond_fixed": "held-out beyond fixed", "held_out_bugs": "held-out bugs", "fp_rate": "FP rate",
    "median_latency_steps": "latency (steps)", "median_step_time_ratio": "step ratio", "campaign": "campaign",
}
