"""The results a query string selects, for the results page, its plots and downloads, the API and
``manage.py export``: which runs (a stored evaluation, a campaign, or every run) narrowed by the
results filter. Everything that shows a number goes through ``Results``, so they all agree."""
import hashlib
from functools import cached_property

import pandas as pd
from django.core.cache import cache
from django.db.models import Count, Q

from bugs.models import Bug
from bugs.permissions import sees_unreviewed
from bugs.selectors import visible_bugs
from runners.models import Run, RunStatus
from runners.selectors import visible_campaigns, visible_runs

from .filters import ResultFilterForm
from .models import Evaluation
from .overhead import OVERHEAD_COLUMNS
from .tables import (
    DETECTION_COLUMNS,
    FALSE_POSITIVE_COLUMNS,
    LATENCY_COLUMNS,
    RUN_LATENCY_COLUMNS,
    detection_table,
    false_positive_table,
    judged_runs,
    latency_table,
    run_latencies,
)

# table name in URLs -> (key in Evaluation.tables, function over judged runs or None, columns). The columns
# are explicit because PostgreSQL's jsonb does not keep the key order of stored records.
TABLES = {
    "detection": ("detection", detection_table, DETECTION_COLUMNS),
    "false-positives": ("false_positives", false_positive_table, FALSE_POSITIVE_COLUMNS),
    "latency": ("latency", latency_table, LATENCY_COLUMNS),
    "overhead": ("overhead", None, OVERHEAD_COLUMNS),
}


RESULTS_CACHE_SECONDS = 24 * 3600


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


def latest_evaluation(viewer):
    """The latest stored evaluation whose campaign ``viewer`` (``results_viewer``'s) may see, or None."""
    return evaluations_for(viewer).first()


def evaluations_for(viewer):
    """The stored evaluations whose campaign ``viewer`` may see, newest first, with their campaign."""
    return Evaluation.objects.filter(campaign__in=visible_campaigns(viewer)).select_related("campaign")


def without_nan(frame):
    """The frame with None for missing values (pandas' NaN would print as "nan")."""
    return frame.astype(object).where(frame.notna(), None)


class Results:
    """``?evaluation=ID`` selects an evaluation's stored tables, ``?campaign=ID`` the live tables of a
    campaign's runs; with neither, the latest evaluation, or every run if there is none. With
    both, the campaign is shown and the evaluation ignored (``ignored_evaluation``). An ID that names no
    evaluation or campaign (or is not a number) raises NotFound. The filter fields (``evaluation.filters``)
    narrow them.

    A stored table is used as stored when the filter keeps whole rows of it (detectors, matrix outcome);
    once the filter narrows the bugs, the false-positive and latency tables are recomputed from the
    evaluation's runs, since their rows pool many bugs. A matrix outcome other than "detected" leaves no
    latency (``Criteria.keeps_detections``).
    """

    def __init__(self, query, user=None):
        evaluation_id, campaign_id = _id(query, "evaluation"), _id(query, "campaign")
        self.viewer = results_viewer(user)
        self.form = ResultFilterForm(query, user=self.viewer)
        self.criteria = self.form.criteria()
        self.evaluation = None
        self.ignored_evaluation = None
        self.campaign = None
        if campaign_id is not None:
            self.campaign = visible_campaigns(self.viewer).filter(pk=campaign_id).first()
            if self.campaign is None:
                raise NotFound(f"No campaign #{campaign_id}.")
            self.ignored_evaluation = evaluation_id
            runs = Run.objects.filter(campaign_id=campaign_id)
        else:
            evaluations = evaluations_for(self.viewer)
            self.evaluation = (evaluations.filter(pk=evaluation_id) if evaluation_id is not None
                               else evaluations).first()
            if evaluation_id is not None and self.evaluation is None:
                raise NotFound(f"No evaluation #{evaluation_id}.")
            runs = self.evaluation.campaign.runs.all() if self.evaluation else Run.objects.all()
        self.campaign_id = campaign_id
        self.runs = self.criteria.runs(visible_runs(self.viewer, runs))

    @property
    def errors(self):
        return self.form.errors

    @cached_property
    def judged(self):
        return judged_runs(self.runs)

    def _stored(self, key, columns):
        return pd.DataFrame.from_records(self.evaluation.tables.get(key, []), columns=columns)

    def table(self, name):
        """One of TABLES as a DataFrame, filtered, with None for missing values."""
        if name not in self._tables:
            self._tables[name] = self._cached(f"table:{name}", lambda: self._compute_table(name))
        return self._tables[name]

    def _compute_table(self, name):
        key, compute, columns = TABLES[name]
        if self.evaluation is not None and (name in ("detection", "overhead") or not self.criteria.narrows_bugs):
            frame = self._stored(key, columns)
        elif compute is None:
            frame = pd.DataFrame.from_records([], columns=columns)  # overhead exists only for a full evaluation
        else:
            frame = compute(judged=self.judged)
        if name == "latency" and not self.criteria.keeps_detections:
            frame = frame.iloc[:0]
        return without_nan(self.criteria.rows(self._visible_rows(frame), outcome=name == "detection"))

    def _visible_rows(self, frame):
        """A table without the rows of bugs the viewer may not see (a stored table keeps its bugs' IDs)."""
        if "bug" not in frame or self.viewer is not None:
            return frame
        hidden = Bug.objects.exclude(pk__in=visible_bugs(None).values("pk")).values_list("bug_id", flat=True)
        return frame[~frame["bug"].isin(set(hidden))]

    @cached_property
    def _tables(self):
        return {}

    def run_latencies(self):
        """Per detected buggy run (of the selected runs): the latency plot's points."""
        if not self.criteria.keeps_detections:
            return pd.DataFrame.from_records([], columns=RUN_LATENCY_COLUMNS)
        return self._cached("latencies", lambda: without_nan(run_latencies(self.judged)))

    def runs_summary(self):
        """What the selected runs are: how many (and how many succeeded), their seeds and environments."""
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
    def _cache_key(self):
        """Where the tables of a *completed* campaign are cached, or None. They cannot change until the
        campaign is reopened (a retry clears ``completed_at``), so the key names its completion time and
        the filter; judging a campaign of 25,000 runs takes seconds, a cached table milliseconds."""
        if self.campaign_id is None or not self.form.is_valid():
            return None
        completed = self.campaign.completed_at  # read with the campaign, in __init__
        if completed is None:
            return None
        filters = repr(sorted((name, str(value)) for name, value in self.form.cleaned_data.items()))
        digest = hashlib.sha256(filters.encode()).hexdigest()[:16]
        audience = "public" if self.viewer is None else "all"
        return f"results:campaign:{self.campaign_id}:{completed.isoformat()}:{audience}:{digest}"

    def _cached(self, part, compute):
        if self._cache_key is None:
            return compute()
        key = f"{self._cache_key}:{part}"
        value = cache.get(key)
        if value is None:
            value = compute()
            cache.set(key, value, RESULTS_CACHE_SECONDS)
        return value

    @property
    def fits(self):
        fits = self.evaluation.tables.get("fits", []) if self.evaluation else []
        return [f for f in fits if not self.criteria.detectors or f.get("detector") in self.criteria.detectors]
