"""The results a query string selects, for the results page, its plots and downloads, the API and
``manage.py export``: which runs (a stored evaluation, a campaign, or every run) narrowed by the
results filter. Everything that shows a number goes through ``Results``, so they all agree."""
from functools import cached_property

import pandas as pd
from django.db.models import Count, Q

from bugs.models import Bug
from bugs.permissions import sees_unreviewed
from bugs.selectors import held_out_view, visible_bugs
from core.caching import cached, digest, kept_for_rows, per_request
from runners.completed import completed_key
from runners.models import CampaignPurpose, Run, RunStatus
from runners.selectors import counted_runs, visible_campaigns

from .filters import ResultFilterForm
from .models import Device, Evaluation
from .overhead import OVERHEAD_COLUMNS
from .tables import (
    DETECTION_COLUMNS,
    FALSE_POSITIVE_COLUMNS,
    FLAKINESS_COLUMNS,
    LATENCY_COLUMNS,
    RUN_LATENCY_COLUMNS,
    detection_table,
    false_positive_table,
    flakiness_table,
    judged_runs,
    latency_table,
    run_latencies,
    with_integration,
)

# table name in URLs -> (key in Evaluation.tables, function over judged runs or None, columns). The columns
# are explicit because PostgreSQL's jsonb does not keep the key order of stored records.
TABLES = {
    "detection": ("detection", detection_table, DETECTION_COLUMNS),
    "false-positives": ("false_positives", false_positive_table, FALSE_POSITIVE_COLUMNS),
    "latency": ("latency", latency_table, LATENCY_COLUMNS),
    "overhead": ("overhead", None, OVERHEAD_COLUMNS),
    "flakiness": ("flakiness", flakiness_table, FLAKINESS_COLUMNS),
}
WHOLE_ROWS = ("detection", "overhead", "flakiness")  # tables whose rows a bug filter keeps or drops whole


class NotFound(LookupError):
    """The query names an evaluation (or a campaign) that does not exist."""


MAX_ID = 2**63 - 1  # a BigAutoField; larger numbers overflow the database's integer


def _id(query, name):
    """The ID given as ``name``, or None when it is absent or empty (the results form's "latest" / "–").
    Anything but ASCII digits names nothing, and neither does a number larger than any key can be (the
    database would overflow): NotFound, the same 404 as an ID that does not exist."""
    value = query.get(name, "")
    if value == "":
        return None
    if not (value.isascii() and value.isdigit()):
        raise NotFound(f"No {name} {value[:40]!r}: an ID is a whole number.")
    if int(value) > MAX_ID:
        raise NotFound(f"No {name} #{value}.")
    return int(value)


def results_viewer(user):
    """Whose view of the runs the result tables take: a maintainer's (every run), or else the public's
    (None), the same for every other user so that their tables are computed and cached once."""
    return user if sees_unreviewed(user) else None


@per_request
def latest_evaluation(viewer, device=Device.CPU):
    """The latest stored evaluation of ``device`` whose campaign ``viewer`` (``results_viewer``'s) may see, or None:
    asked once per request (the catalog's leaderboard box and "caught by" column both show it). The CPU one by
    default: it covers the whole catalog and is the headline; a GPU evaluation is shown where asked for by name
    (``environment_tabs``)."""
    return evaluations_for(viewer).filter(device=device).first()


def environment_tabs(viewer, shown):
    """The results and leaderboard pages' switch between environments: per device, the latest evaluation of it
    that ``viewer`` may see (None: none yet), and whether it is the one ``shown``."""
    tabs = []
    for device, label in Device.choices:
        evaluation = latest_evaluation(viewer, device)
        tabs.append({"device": device, "label": label, "evaluation": evaluation,
                     "current": shown is not None and shown.device == device})
    return tabs


def cached_for(evaluation, part, compute):
    """``compute()`` over ``evaluation``'s stored tables, cached under their digest (``Evaluation.tables_digest``,
    which every save of the tables sets: retabulating the evaluation changes it)."""
    return cached(f"evaluation:{evaluation.pk}:{evaluation.tables_digest}:{part}", compute)


def evaluations_for(viewer, campaigns=None):
    """The stored evaluations whose campaign ``viewer`` may see (``campaigns``: ``visible_campaigns(viewer)`` if
    already made), newest first, with their campaign; their tables are read when first used (a list of evaluations
    shows none)."""
    campaigns = visible_campaigns(viewer) if campaigns is None else campaigns
    return Evaluation.objects.filter(campaign__in=campaigns).select_related("campaign").defer("tables")


# Everything the results page, its API, the leaderboard and the exports show comes from these tables (the selection,
# its filter's choices, the runs' environments, the bugs' visibility and verdicts), and from the cache's parts of
# stored evaluations and completed campaigns: a selection still changing (an open campaign, every run) is computed
# at each request.
SHOWN_TABLES = ("bugs.Bug", "bugs.Reproducer", "bugs.ReproducerVersion", "runners.Campaign", "runners.Detector",
                "runners.DetectorVersion", "runners.Environment", "evaluation.Evaluation",
                "evaluation.SensitivityEvaluation")


def shown_once(request, part, compute):
    """``compute()``, kept for the same rows of SHOWN_TABLES, query string and reader (``kept_for_rows``)."""
    return kept_for_rows(request, part, SHOWN_TABLES, compute)


def without_nan(frame):
    """The frame with None for missing values (pandas' NaN would print as "nan")."""
    return frame.astype(object).where(frame.notna(), None)


class Results:
    """``?evaluation=ID`` selects an evaluation's stored tables, ``?campaign=ID`` the live tables of a
    campaign's runs; with neither, the latest evaluation of ``?device=`` (cpu, the default, or gpu:
    ``latest_evaluation``), or for the CPU every run if there is none.
    With both, the campaign is shown and the evaluation ignored (``ignored_evaluation``). An ID that names no
    evaluation or campaign (or is not a number) raises NotFound. The filter fields (``evaluation.filters``)
    narrow them.

    A stored table is used as stored when the filter keeps whole rows of it (detectors, matrix outcome);
    once the filter narrows the bugs, the false-positive and latency tables are recomputed from the
    evaluation's runs, since their rows pool many bugs. A table that an evaluation did not store (it predates
    the table: ``computed_now``) is computed from its runs. A matrix outcome other than "detected" leaves no
    latency (``Criteria.keeps_detections``).
    """

    def __init__(self, query, user=None):
        evaluation_id, campaign_id = _id(query, "evaluation"), _id(query, "campaign")
        self.viewer = results_viewer(user)
        self.form = ResultFilterForm(query, user=self.viewer)
        self.criteria = self.form.criteria()
        self.campaigns = visible_campaigns(self.viewer)
        self.evaluations = evaluations_for(self.viewer, self.campaigns)
        self.evaluation = None
        self.ignored_evaluation = None
        self.campaign = None
        if campaign_id is not None:
            self.campaign = self.campaigns.filter(pk=campaign_id).first()
            if self.campaign is None:
                raise NotFound(f"No campaign #{campaign_id}.")
            if self.campaign.purpose == CampaignPurpose.SENSITIVITY:  # mutants, bundled detectors: its own tables
                raise NotFound(f"Campaign #{campaign_id} is a sensitivity evaluation's: its tables are at "
                               "/results/sensitivity/.")
            self.ignored_evaluation = evaluation_id
            runs = Run.objects.filter(campaign_id=campaign_id)
        elif evaluation_id is not None:  # an evaluation named by its ID: its device whatever ?device= says
            self.evaluation = self.evaluations.filter(pk=evaluation_id).first()
            if self.evaluation is None:
                raise NotFound(f"No evaluation #{evaluation_id}.")
        else:
            device = query.get("device") or Device.CPU
            if device not in Device.values:
                raise NotFound(f"No such device: an evaluation ran on {' or '.join(Device.values)}.")
            self.evaluation = latest_evaluation(self.viewer, device)
            if self.evaluation is None and device != Device.CPU:
                raise NotFound(f"No {Device(device).label} evaluation is stored yet.")
        if self.campaign is None:
            runs = self.evaluation.campaign.runs.all() if self.evaluation else counted_runs(self.viewer)
        self.campaign_id = campaign_id
        # the runs of a campaign the viewer may see all count for them (runners.selectors.visible_campaigns): those
        # of held-out bugs too, whose rows ``_visible_rows`` leaves out of every table and plot
        self.runs = self.criteria.runs(runs)

    @property
    def errors(self):
        return self.form.errors

    @cached_property
    def judged(self):
        """The selected runs judged, one row per detector that watched them (a bundle's run, one per member): only
        the filter's detectors."""
        judged = judged_runs(self.runs)
        if self.criteria.detectors:
            judged = [item for item in judged if item[0]["detector__name"] in self.criteria.detectors]
        return judged

    def _stored(self, key, columns):
        return pd.DataFrame.from_records(self.evaluation.tables.get(key, []), columns=columns)

    def table(self, name):
        """One of TABLES as a DataFrame, filtered, with None for missing values and each detector's integration
        (drop-in or opt-in: ``tables.with_integration``)."""
        if name not in self._tables:
            self._tables[name] = self.cached(f"table:{name}", lambda: self._compute_table(name))
        return self._tables[name]

    def computed_now(self, name):
        """Whether table ``name`` of a stored evaluation is computed from its runs because the evaluation predates
        it (``manage.py evaluate --retabulate ID`` stores it)."""
        key, compute, _ = TABLES[name]
        return self.evaluation is not None and compute is not None and key not in self._stored_names

    @cached_property
    def _stored_names(self):
        """The names of the tables the evaluation stored, read from them once for the same tables."""
        return cached_for(self.evaluation, "stored-names", lambda: list(self.evaluation.tables))

    def _compute_table(self, name):
        key, compute, columns = TABLES[name]
        if (self.evaluation is not None and not self.computed_now(name)
                and (name in WHOLE_ROWS or not self.criteria.narrows_bugs)):
            frame = self._stored(key, columns)
        elif compute is None:
            frame = pd.DataFrame.from_records([], columns=columns)  # overhead exists only for a full evaluation
        else:
            frame = compute(judged=self.judged)
        if name == "latency" and not self.criteria.keeps_detections:
            frame = frame.iloc[:0]
        frame = with_integration(self._visible_rows(frame))
        return without_nan(self.criteria.rows(frame, outcome=name == "detection"))

    def _visible_rows(self, frame):
        """A table without the rows of bugs the viewer may not see (a stored table keeps its bugs' IDs): unreviewed
        ones, and held-out ones, whose runs the aggregate rows (false positives, latency) still count."""
        if "bug" not in frame or self.viewer is not None:
            return frame
        hidden = Bug.objects.exclude(pk__in=visible_bugs(None).values("pk")).values_list("bug_id", flat=True)
        return frame[~frame["bug"].isin(set(hidden))].reset_index(drop=True)

    @cached_property
    def _tables(self):
        return {}

    def run_latencies(self):
        """Per detected buggy run (of the selected runs): the latency plot's points."""
        if not self.criteria.keeps_detections:
            return pd.DataFrame.from_records([], columns=RUN_LATENCY_COLUMNS)
        return self.cached("latencies", lambda: without_nan(self._visible_rows(run_latencies(self.judged))))

    def runs_summary(self):
        """What the selected runs are: how many (and how many succeeded), their seeds and environments."""
        return self.cached("summary", self._runs_summary)

    def _runs_summary(self):
        runs = self.runs
        environments = list(runs.exclude(environment=None).order_by()
                            .values_list("environment__torch", "environment__host").distinct())
        succeeded = Count("pk", filter=Q(status=RunStatus.SUCCEEDED))
        counts = runs.order_by().aggregate(runs=Count("pk"), succeeded=succeeded)
        return {
            **counts,
            "seeds": sorted(set(runs.order_by().values_list("seed", flat=True).distinct())),
            "torch": sorted({torch for torch, _ in environments} - {""}),
            "hosts": sorted({host for _, host in environments} - {""}),
        }

    @cached_property
    def cache_key(self):
        """The key of what this selection shows, or None while it can still change. A stored evaluation's tables are
        named by their digest (retabulating one changes it) and the completion of its campaign (the latency points
        and the summary come from its runs); a campaign's by its completion (``runners.completed``); then whose view
        (a maintainer's, or the public's of the bugs held out now: a campaign with a run of unreviewed code is not
        found at all, so the public's tables never depend on more) and the filter. Every run or the tables of an
        open campaign: None."""
        if not self.form.is_valid():
            return None
        if self.campaign is not None:
            selection = completed_key(self.campaign, "results")
        elif self.evaluation is not None:
            of_runs = completed_key(self.evaluation.campaign, "evaluation")
            selection = of_runs and f"{of_runs}:{self.evaluation.pk}:{self.evaluation.tables_digest}"
        else:
            selection = None
        if selection is None:
            return None
        if self.evaluation is None or self.computed_now("flakiness"):  # judged by the bugs' verdicts of today
            selection += ":" + digest(list(Bug.objects.order_by("pk").values_list("pk", "status")))
        filters = digest(sorted((name, str(value)) for name, value in self.form.cleaned_data.items()))
        return f"results:{selection}:{held_out_view(self.viewer)}:{filters}"

    def cached(self, part, compute):
        """``compute()``, cached under ``cache_key`` while the selection cannot change (core.caching)."""
        return cached(self.cache_key and f"{self.cache_key}:{part}", compute)

    @property
    def fits(self):
        fits = self.evaluation.tables.get("fits", []) if self.evaluation else []
        return [f for f in fits if not self.criteria.detectors or f.get("detector") in self.criteria.detectors]
