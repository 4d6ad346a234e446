"""The version matrix: every bug reproducer x torch release, from the stored ``plain`` runs (buggy and fixed, over
seeds) of version-matrix campaigns (``manage.py version_matrix``), the newest one unless others are chosen.

A run's release is the torch of the Python environment it asked for (runners.models.PythonEnvironment; its public
version: the default environment's "2.13.0+cpu" is release 2.13.0), or the default environment's for a run that
asked for none. Each cell says what the release does with the reproducer,
by the majority of its buggy runs (``runners.bisection.release_outcome``: reproduces, does not, fails; the same
outcome a bisection gives a release), and its stability by the verification's own rule
(``StabilityCheck.verdict_for``: verified, flaky, unreproducible) over the same runs. A cell whose runs are not
all finished is pending. The page (/results/versions/), the exports (``manage.py export versions``) and
docs/versions.md (``manage.py versions_doc``) all read ``version_matrix``."""
from collections import defaultdict
from dataclasses import dataclass, field

import pandas as pd

from core.exports import WIDE_COLUMNS, Table
from runners.bisection import ReleaseOutcome, release_key, release_of, release_outcome
from runners.models import FINISHED_STATUSES, PythonEnvironment, Run, RunStatus, StabilityCheck
from runners.selectors import visible_campaigns, visible_runs

from .results import NotFound, _id

MATRIX_KEY = "version_matrix"  # a version-matrix campaign's parameters hold {MATRIX_KEY: {"releases": [...]}}
PLAIN = "plain"
DEFAULT_RELEASE = "2.13.0"  # the torch the project pins (pyproject.toml), until a default environment is recorded
PENDING = "pending"
TONES = {ReleaseOutcome.REPRODUCES: "detected", ReleaseOutcome.DOES_NOT: "succeeded", ReleaseOutcome.FAILS: "failed",
         PENDING: "queued"}

ABOUT = ("Version matrix: what each torch release does with each bug reproducer's buggy variant, by the majority of "
         "its seeds, run without a detector (plain): reproduces (the symptom manifested on most seeds), does not, or "
         "fails (failed runs could have decided it); then buggy runs manifested / buggy runs, fixed runs manifested / "
         "fixed runs, and the stability verdict over the same runs (verified: every buggy run manifested and no "
         "fixed one; unreproducible: no buggy run did; flaky: anything else, a failed run included). --: not run "
         "(the reproducer does not apply to that release).")


def matrix_campaigns(user=None):
    """The version-matrix campaigns ``user`` may see, newest first."""
    return visible_campaigns(user).filter(parameters__has_key=MATRIX_KEY).order_by("-created_at", "-id")


def default_release():
    """The torch of the default environment (the workers' own interpreter)."""
    return release_of(PythonEnvironment.objects.filter(is_default=True).values_list("torch", flat=True).first()
                      or DEFAULT_RELEASE)


@dataclass
class Cell:
    """One reproducer on one release."""

    release: str
    buggy_runs: int = 0
    buggy_manifested: int = 0
    buggy_failed: int = 0
    fixed_runs: int = 0
    fixed_manifested: int = 0
    failed_runs: int = 0
    pending_runs: int = 0
    seeds: set = field(default_factory=set)

    @property
    def outcome(self):
        """A ReleaseOutcome, or PENDING while a run is queued or running, or None without a buggy run."""
        if self.pending_runs:
            return PENDING
        if not self.buggy_runs:
            return None
        return release_outcome(self.buggy_runs, self.buggy_manifested, self.buggy_failed)

    @property
    def outcome_label(self):
        outcome = self.outcome
        return outcome.label if isinstance(outcome, ReleaseOutcome) else outcome or "--"

    @property
    def tone(self):
        """The badge class (static/css/site.css) of the outcome."""
        return TONES.get(self.outcome, "queued")

    @property
    def stability(self):
        """The verification's verdict over these runs (``StabilityCheck.verdict_for``), once all are finished: over
        the buggy runs, not the seeds, as campaigns combined may run the same seed more than once."""
        if self.pending_runs or not self.buggy_runs:
            return None
        return StabilityCheck.verdict_for(self.buggy_runs, self.buggy_manifested, self.fixed_manifested,
                                          self.failed_runs)

    @property
    def counts(self):
        """"buggy a/k, fixed b/k" and the failed runs."""
        failed = f", {self.failed_runs} failed" if self.failed_runs else ""
        return (f"buggy {self.buggy_manifested}/{self.buggy_runs}, fixed {self.fixed_manifested}/{self.fixed_runs}"
                f"{failed}")

    @property
    def detail(self):
        """What the page shows under the outcome: the counts, or the runs still to finish."""
        if self.outcome == PENDING:
            return f"{self.pending_runs} run{'s' if self.pending_runs != 1 else ''} to go"
        return self.counts

    def text(self):
        """The cell as the exports print it: "reproduces (buggy 3/3, fixed 0/3; verified)"."""
        if self.outcome == PENDING:
            return f"pending ({self.detail})"
        stability = self.stability
        return f"{self.outcome_label} ({self.counts}{f'; {stability}' if stability else ''})"


@dataclass
class Row:
    bug: str
    reproducer: str
    cells: list  # a Cell or None per release of the matrix

    @property
    def flips(self):
        """[(release before, release after, outcome before, outcome after)] where the decided outcome changes from
        one release to the next that decided (fails and pending ones are passed over)."""
        decided = [cell for cell in self.cells if cell is not None
                   and cell.outcome in (ReleaseOutcome.REPRODUCES, ReleaseOutcome.DOES_NOT)]
        return [(a.release, b.release, a.outcome_label, b.outcome_label)
                for a, b in zip(decided, decided[1:]) if a.outcome != b.outcome]

    @property
    def flips_text(self):
        return "; ".join(f"{before} -> {after} at {release}" for _, release, before, after in self.flips) or "none"


@dataclass
class VersionMatrix:
    campaigns: list
    releases: list
    rows: list

    @property
    def seeds(self):
        return sorted({seed for row in self.rows for cell in row.cells if cell for seed in cell.seeds})

    def row_of(self, bug_id):
        return [row for row in self.rows if row.bug == bug_id]

    def described(self):
        """Which runs the matrix covers, for captions."""
        names = ", ".join(f"#{campaign.pk} ({campaign.created_at:%Y-%m-%d})" for campaign in self.campaigns)
        seeds = ", ".join(map(str, self.seeds)) or "none"
        return (f"Runs: SilentBench version-matrix campaign{'s' if len(self.campaigns) != 1 else ''} {names}; "
                f"torch {', '.join(self.releases)}; seeds {seeds}.")

    def frame(self):
        """A row per bug and reproducer, a column per release holding ``Cell.text``, and where the outcome flips."""
        return pd.DataFrame([[row.bug, row.reproducer, *(cell.text() if cell else None for cell in row.cells),
                              row.flips_text] for row in self.rows],
                            columns=["bug", "reproducer", *self.releases, "flips"], dtype=object)


def campaigns_for(query, user=None):
    """The campaigns the query's ``campaign`` values (IDs, repeatable) name, or the newest version-matrix
    campaign; NotFound for an ID that names no campaign ``user`` may see, or when there is none."""
    ids = query.getlist("campaign") if hasattr(query, "getlist") else list(query.get("campaign") or [])
    if not ids:
        newest = matrix_campaigns(user).first()
        if newest is None:
            raise NotFound("No version-matrix campaign yet: manage.py version_matrix creates one.")
        return [newest]
    ids = [_id({"campaign": str(value)}, "campaign") for value in ids]  # NotFound for anything but a possible ID
    found = list(visible_campaigns(user).filter(pk__in=[pk for pk in ids if pk is not None])
                 .order_by("created_at", "id"))
    missing = sorted({pk for pk in ids if pk is not None} - {campaign.pk for campaign in found})
    if missing:
        raise NotFound(f"No campaign {', '.join(f'#{pk}' for pk in missing)}.")
    return found


def version_matrix(campaigns, user=None, bug_ids=None):
    """The ``VersionMatrix`` of the plain runs of bug reproducers in ``campaigns`` that ``user`` may see (only the
    bugs of ``bug_ids`` when given)."""
    runs = Run.objects.filter(campaign__in=campaigns, detector__name=PLAIN,
                              reproducer_version__reproducer__bug__isnull=False)
    if bug_ids is not None:
        runs = runs.filter(reproducer_version__reproducer__bug__bug_id__in=bug_ids)
    runs = visible_runs(user, runs).order_by().values_list(
        "reproducer_version__reproducer__bug__bug_id", "reproducer_version__reproducer__name",
        "python_environment__torch", "variant", "seed", "status", "manifested")
    default = default_release()
    cells = defaultdict(dict)
    for bug, reproducer, torch, variant, seed, status, manifested in runs:
        release = release_of(torch) if torch else default
        cell = cells[(bug, reproducer)].setdefault(release, Cell(release))
        cell.seeds.add(seed)
        if status not in FINISHED_STATUSES:
            cell.pending_runs += 1
            continue
        failed = status != RunStatus.SUCCEEDED
        cell.failed_runs += failed
        if variant == "buggy":
            cell.buggy_runs += 1
            cell.buggy_failed += failed
            cell.buggy_manifested += bool(manifested) and not failed
        else:
            cell.fixed_runs += 1
            cell.fixed_manifested += bool(manifested) and not failed
    planned = [release for campaign in campaigns for release in campaign.parameters.get(MATRIX_KEY, {})
               .get("releases", [])]
    releases = sorted({*planned, *(release for row in cells.values() for release in row)}, key=_release_order)
    rows = [Row(bug, reproducer, [cells[(bug, reproducer)].get(release) for release in releases])
            for bug, reproducer in sorted(cells)]
    return VersionMatrix(list(campaigns), releases, rows)


def _release_order(release):
    try:
        return (0, release_key(release), release)
    except ValueError:  # a local build's name sorts after the releases, never breaks the page
        return (1, None, release)


def selected_matrix(query, user=None):
    return version_matrix(campaigns_for(query, user), user)


def versions_export(query, user=None):
    """The export of the version matrix the query selects (``campaign``, repeatable; default: the newest)."""
    matrix = selected_matrix(query, user)
    frame, width = matrix.frame(), release_width(matrix.releases)
    return Table("versions", frame, caption=f"{ABOUT} {matrix.described()}", paper=frame,
                 align={**FIXED_COLUMNS, **dict.fromkeys(matrix.releases, f"p{{{width:.2f}cm}}")})


# The LaTeX layout: paragraph columns, the releases' sharing what is left of a two-column paper's text width (17.8 cm)
# after the others and the space between columns (core.exports sets a table of more than WIDE_COLUMNS columns
# with less of it).
FIXED_COLUMNS = {"bug": "p{2.2cm}", "reproducer": "p{1.8cm}", "flips": "p{2.4cm}"}
TEXT_WIDTH_CM = 17.6


def release_width(releases):
    columns = len(releases) + len(FIXED_COLUMNS)
    between = 0.18 if columns > WIDE_COLUMNS else 0.43  # 2 x 2.5pt, or 2 x 6pt, in cm
    fixed = sum(float(align[2:-3]) for align in FIXED_COLUMNS.values())
    return min(3.2, (TEXT_WIDTH_CM - fixed - between * columns) / max(1, len(releases)))


def bug_version_rows(bug, user=None):
    """(the newest version-matrix campaign ``user`` may see, its releases, the rows of ``bug``), or None when
    there is no such campaign."""
    campaign = matrix_campaigns(user).first()
    if campaign is None:
        return None
    matrix = version_matrix([campaign], user, bug_ids=[bug.bug_id])
    return {"campaign": campaign, "releases": matrix.releases, "rows": matrix.rows}
