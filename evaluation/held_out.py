"""A maintainer may hold a bug out (`bugs.actions.do_hold_out_bug`), so that no detector can be tuned on it: its ID,
title, fields, code and per-bug results are then seen by the maintainers only. Everyone else, its submitter included,
gets a 404 for its page, its versions and its runs, finds it in no list, export, filter or search (asking for its ID
answers as for an ID that does not exist), and sees only its opaque label, "held-out #N" (numbered in the order bugs
are held out, never reused), and the aggregate scores that count it. One layer hides it, `bugs/selectors.py` and
`runners/selectors.py`: a campaign that ran it is still listed, without its rows; a campaign that ran only held-out
bugs is hidden whole.

Aggregates count its runs: the false-positive and latency tables, and the leaderboard's held-out score, for which a
detector's public score and its held-out score are counted apart, from the same detection table (its
`detected_beyond_fixed_runs`):

* **public score**: the bugs caught beyond the fixed twin among the bugs that are not held out;
* **held-out score**: the held-out bugs caught beyond the fixed twin, of the held-out bugs that the selection ran
  after they were held out. A held-out bug counts only with the runs of campaigns created after it was last held
  out (`Bug.held_out_at`): no detector is scored on a bug it could have been tuned on while the bug was public, and
  a bug moved from the public split keeps no score from earlier campaigns.

Moving a bug either way (`do_hold_out_bug`, `do_publish_bug`: a maintainer's button on the bug's page, or the
admin's actions) is recorded in its audit trail with who moved it and when. A bug published again is public with
every result it has. A held-out bug comes through a submission, never through the catalog's files, which are
public. The names the system gives campaigns name no bug (a verification counts its reproducers), and words a
maintainer typed that hold a held-out bug's ID, in any case (a campaign's name, an evaluation's command line), are
shown to everyone else withheld whole, on the pages, the API, the exports and the admin
(`runners.selectors.shown_name`, `shown_command`); a campaign's recorded plan lists only the reproducers the reader
may see (`shown_parameters`), in the admin too. An ID is never reused, so a submission that takes a held-out bug's
ID is refused as taken: whoever guesses an exact ID learns that it exists, and nothing else."""
from dataclasses import dataclass, field

from django.db.models import F, Q

from bugs.models import Bug
from bugs.selectors import held_out_state

from .tables import detection_table


@dataclass(frozen=True)
class Split:
    """A detector's score on one split: the bugs it ran on (a buggy run), those it caught (a detected buggy run) and
    those it caught beyond the fixed twin, the leaderboard's rank key."""

    bugs: int = 0
    caught: int = 0
    beyond_fixed: int = 0


@dataclass(frozen=True)
class HeldOutScores:
    """{detector: Split} on the public bugs and on the held-out ones, and ``held_out_total``: the held-out bugs that
    the selection scores (those with a buggy run, under any of its detectors, in a campaign created after the bug
    was held out), the denominator of every detector's held-out score."""

    public: dict = field(default_factory=dict)
    held_out: dict = field(default_factory=dict)
    held_out_total: int = 0

    def of(self, detector):
        """(public Split, held-out Split) of ``detector``; empty Splits for a detector without such runs."""
        return self.public.get(detector, Split()), self.held_out.get(detector, Split())


def scored_runs(runs):
    """Of ``runs``, those whose results may count: any run of a public bug or of a clean pipeline, and a run of a
    held-out bug only if its campaign was created after the bug was held out."""
    bug = "reproducer_version__reproducer__bug"
    return runs.filter(Q(**{f"{bug}__isnull": True}) | Q(**{f"{bug}__held_out": False})
                       | Q(campaign__created_at__gt=F(f"{bug}__held_out_at")))


def split_scores(records, held_out, counted_held_out):
    """``HeldOutScores`` from detection-table records: the public split is every bug not in ``held_out`` (the IDs of
    the bugs held out now), the held-out split the bugs of ``counted_held_out`` (those whose rows come from campaigns
    created after they were held out)."""
    public, held = {}, {}
    for split, rows in ((public, [r for r in records if r["bug"] not in held_out]),
                        (held, [r for r in records if r["bug"] in counted_held_out])):
        for detector in sorted({row["detector"] for row in rows}):
            mine = [row for row in rows if row["detector"] == detector]
            split[detector] = Split(
                bugs=len({row["bug"] for row in mine if row.get("buggy_runs")}),
                caught=len({row["bug"] for row in mine if row.get("detected_runs")}),
                beyond_fixed=len({row["bug"] for row in mine if row.get("detected_beyond_fixed_runs")}))
    total = len({row["bug"] for row in records if row["bug"] in counted_held_out and row.get("buggy_runs")})
    return HeldOutScores(public=public, held_out=held, held_out_total=total)


def held_out_since():
    """{bug ID: when it was held out} of the bugs held out now."""
    return dict(Bug.objects.filter(held_out=True).values_list("bug_id", "held_out_at"))


def scores_of_runs(runs):
    """``HeldOutScores`` of ``runs`` (a queryset of runs, of any campaigns): the detection table of those that may
    count (``scored_runs``)."""
    held_out = held_out_since()
    records = detection_table(scored_runs(runs)).to_dict("records")
    return split_scores(records, set(held_out), set(held_out))


def scores_of_evaluation(evaluation):
    """``HeldOutScores`` of a stored evaluation's detection table: one campaign, so a held-out bug's rows count when
    that campaign was created after the bug was held out."""
    held_out = held_out_since()
    created = evaluation.campaign.created_at
    counted = {bug_id for bug_id, since in held_out.items() if created > since}
    return split_scores(evaluation.tables.get("detection", []), set(held_out), counted)


def held_out_scores(results):
    """``HeldOutScores`` of a selection (``evaluation.results.Results``), whoever reads it: a stored evaluation's
    stored table when the selection keeps its runs whole, else the runs selected. Kept under the selection's key and
    the held-out split of now (holding a bug out or publishing one is a new key)."""
    def compute():
        evaluation = results.evaluation
        if evaluation is not None and "detection" in evaluation.tables and not results.criteria.narrows_runs:
            return scores_of_evaluation(evaluation)
        return scores_of_runs(results.runs)
    return results.cached(f"held-out-scores:{held_out_state()}", compute)


def public_tables(tables):
    """Stored tables ({name: [records]}) without the records of bugs held out now: for what is written for everyone
    from stored data (docs/results.md, evaluation.results_doc), which no reader's view filters."""
    held_out = set(held_out_since())
    return {name: [row for row in rows if not (isinstance(row, dict) and row.get("bug") in held_out)]
            if isinstance(rows, list) else rows for name, rows in tables.items()}
