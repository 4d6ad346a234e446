"""Bisection across torch releases: which release first changes what a reproducer's oracle says.

A *probe* runs the buggy variant of one reproducer version under the ``plain`` detector (no instrumentation), for
the seeds given, in the environment of one release. Its outcome (``release_outcome``) is decided by the majority of
its seeds: the release *reproduces* the bug when the symptom manifested on more than half of them, *does not* when
it did not manifest on more than half, and *fails* when the runs that failed (crashed, timed out, were refused)
could have decided either way. The version matrix (evaluation.versions) gives its cells the same outcome.

``next_probes`` is the planner, pure: given the ordered releases and the outcomes known so far, it names the
releases to probe next, up to ``k`` at once (k-section: with k workers free, k probes split the interval still in
question into k + 1 parts, so a round costs one verification's time and the interval shrinks (k + 1)-fold), or
the result. A release that fails is skipped, as ``git bisect skip`` does: the change is then reported between the
last release that agreed with the good one and the first that disagreed, with the failing releases between them.
The driver (evaluation.actions: ``do_start_bisection``, ``do_advance_bisection``) stores each round's probes
and runs them on the workers."""
import json
import urllib.request
from dataclasses import dataclass, field

from django.db import models
from packaging.version import InvalidVersion, Version

from core.enums import Variant

from .actions.detectors import do_record_detector
from .environments.python_environments import build_environment, default_environment
from .environments.routing import queue_for
from .models import PythonEnvironment, Run, RunStatus
from .plans import CampaignPlan, PlannedRun, runs_in
from .selectors import live_workers

PYPI_JSON = "https://pypi.org/pypi/{package}/json"
INDEX_TIMEOUT_SECONDS = 30


class ReleaseOutcome(models.TextChoices):
    """What a release does with a reproducer's buggy variant, by the majority of its seeds."""

    REPRODUCES = "reproduces", "reproduces"
    DOES_NOT = "does_not", "does not"
    FAILS = "fails", "fails"


def release_outcome(seeds, manifested, failed):
    """The outcome of ``seeds`` buggy runs of which ``manifested`` showed the symptom and ``failed`` did not
    succeed: reproduces on a majority of manifestations; does not when even the failed runs, had they manifested,
    would not have made a majority; else fails (2 of 3 seeds failed, or 1 manifested, 1 failed, 1 did not)."""
    if seeds <= 0:
        raise ValueError("an outcome needs at least one seed")
    if 2 * manifested > seeds:
        return ReleaseOutcome.REPRODUCES
    if 2 * (manifested + failed) > seeds:
        return ReleaseOutcome.FAILS
    return ReleaseOutcome.DOES_NOT


def release_key(release):
    """The sort key of a release name ("2.9.0" < "2.10.0"); ValueError for a name that is no version."""
    try:
        return Version(release)
    except InvalidVersion:
        raise ValueError(f"{release!r} is not a release version (e.g. 2.11.0)") from None


def final_release(release):
    """``release_key`` of a release a bisection may start or end at: ValueError for a pre-release (2.13.0rc1), as
    the package index's releases between them are final ones only."""
    key = release_key(release)
    if key.is_prerelease:
        raise ValueError(f"{release!r} is a pre-release: a bisection runs between final releases (e.g. "
                         f"{key.base_version})")
    return key


def releases_between(good, bad, available):
    """The releases of ``available`` from ``good`` to ``bad`` inclusive, oldest first (``good`` may be the newer
    one: a bisection of when a bug was fixed starts from a release that has it), compared as versions ("2.9" is
    "2.9.0", and is listed once). Final releases only; ``good`` and ``bad`` are kept as given, must be final
    (``final_release``) and must be in ``available``."""
    ends = {final_release(good): good, final_release(bad): bad}
    known = {}
    for release in available:
        known.setdefault(release_key(release), release)
    missing = [release for key, release in ends.items() if key not in known]
    if missing:
        raise ValueError(f"{' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} not among the releases "
                         f"({', '.join(known[key] for key in sorted(known)) or 'none'})")
    known.update(ends)
    low, high = sorted(ends)
    chosen = [known[key] for key in sorted(known) if low <= key <= high and not key.is_prerelease]
    return chosen if release_key(good) <= release_key(bad) else chosen[::-1]


def index_releases(package="torch", url=PYPI_JSON, platform=("cp311", "linux", "x86_64")):
    """The releases of ``package`` that the package index serves for this platform (a wheel whose name holds each
    of ``platform``, not yanked), from PyPI's JSON API. OSError when the index cannot be read."""
    with urllib.request.urlopen(url.format(package=package), timeout=INDEX_TIMEOUT_SECONDS) as response:
        data = json.load(response)
    served = []
    for release, files in data.get("releases", {}).items():
        wheels = [f for f in files if not f.get("yanked") and all(part in f.get("filename", "") for part in platform)]
        try:
            final = not Version(release).is_prerelease
        except InvalidVersion:
            continue
        if wheels and final:
            served.append(release)
    return sorted(served, key=release_key)


@dataclass(frozen=True)
class BisectionResult:
    """Where the oracle changed: ``first_changed`` is the first release whose outcome differs from the good one's
    and ``last_same`` the last before it that agrees, with the releases that ``failed`` between them (the change
    may lie at any of them); both None when there is no change to find, which ``reason`` says."""

    first_changed: str | None
    last_same: str | None
    failed_between: tuple = ()
    reason: str = ""


@dataclass(frozen=True)
class Step:
    """What the planner says next: the releases to probe now, or the result (then ``probes`` is empty)."""

    probes: tuple = ()
    result: BisectionResult | None = None


def spread(candidates, k):
    """Up to ``k`` of ``candidates`` (in order) that split them as evenly as can be: with c candidates, the ones
    at positions round((i + 1)(c + 1) / (k + 1)) - 1, so that the c + 2 points of the interval fall into k + 1
    parts of nearly equal size."""
    if len(candidates) <= k:
        return tuple(candidates)
    count = len(candidates)
    picked = dict.fromkeys(candidates[min(count - 1, max(0, round((i + 1) * (count + 1) / (k + 1)) - 1))]
                           for i in range(k))
    return tuple(picked)


def next_probes(releases, known, k):
    """The next ``Step`` of a k-section over ``releases`` (ordered: the good one first, the bad one last), given
    ``known`` {release: ReleaseOutcome} of the probes made so far. The first round probes both ends, and with
    more than two workers the interior too; a round never probes a release twice."""
    if k < 1:
        raise ValueError("a bisection needs at least one worker slot")
    if len(releases) < 2:
        raise ValueError("a bisection needs a good and a bad release")
    good, bad = releases[0], releases[-1]
    ends = [release for release in (good, bad) if release not in known]
    if ends:
        interior = [release for release in releases[1:-1] if release not in known]
        return Step(probes=tuple(ends) + spread(interior, k - len(ends)) if k > len(ends) else tuple(ends[:k]))
    for end, name in ((good, "good"), (bad, "bad")):
        if known[end] == ReleaseOutcome.FAILS:
            return Step(result=BisectionResult(None, None, reason=f"the {name} release {end} fails: there is no "
                                                                   f"outcome to compare against"))
    base = known[good]
    if known[bad] == base:
        return Step(result=BisectionResult(None, None, reason=f"no change: the oracle says {base.label} on both "
                                                               f"{good} and {bad}"))
    # the first decided release that disagrees with the good one, and the last agreeing one before it
    hi = next(i for i, release in enumerate(releases)
              if known.get(release) not in (None, base, ReleaseOutcome.FAILS))
    lo = max(i for i in range(hi) if known.get(releases[i]) == base)
    candidates = [release for release in releases[lo + 1:hi] if release not in known]
    if candidates:
        return Step(probes=spread(candidates, k))
    failed = tuple(release for release in releases[lo + 1:hi] if known[release] == ReleaseOutcome.FAILS)
    reason = (f"the oracle says {base.label} up to {releases[lo]} and {known[releases[hi]].label} from "
              f"{releases[hi]}" + (f"; {', '.join(failed)} between them failed, so the change may lie there"
                                   if failed else ""))
    return Step(result=BisectionResult(releases[hi], releases[lo], failed, reason))


@dataclass
class Simulation:
    """What a k-section does against a known oracle: its rounds (the releases probed in each) and its result."""

    rounds: list = field(default_factory=list)
    result: BisectionResult | None = None

    @property
    def probes(self):
        return sum(len(round_) for round_ in self.rounds)


def simulate(releases, oracle, k):
    """Run the planner against ``oracle`` (release -> ReleaseOutcome) until it has a result: for tests, and for
    estimating how many rounds a bisection takes with k workers."""
    known, simulation = {}, Simulation()
    while True:
        step = next_probes(releases, known, k)
        if step.result is not None:
            simulation.result = step.result
            return simulation
        simulation.rounds.append(list(step.probes))
        known.update({release: oracle(release) for release in step.probes})


# --- Probes on the workers ---

def probe_outcome(runs):
    """(ReleaseOutcome, manifested, failed, wall seconds) of a probe's finished ``runs`` (a queryset)."""
    rows = list(runs.values_list("status", "manifested", "wall_seconds"))
    failed = sum(status != RunStatus.SUCCEEDED for status, _, _ in rows)
    manifested = sum(status == RunStatus.SUCCEEDED and bool(shown) for status, shown, _ in rows)
    seconds = sum(wall or 0.0 for _, _, wall in rows)
    return release_outcome(len(rows), manifested, failed), manifested, failed, seconds


def probe_runs(campaign, environment):
    """The runs of a round's ``campaign`` that probe the release of ``environment`` (a run of the default
    environment may also have asked for none)."""
    runs = campaign.runs.filter(python_environment=environment)
    if environment is not None and environment.is_default:
        runs = runs | campaign.runs.filter(python_environment__isnull=True)
    return runs


def free_slots():
    """Worker slots free now: the live workers' concurrency less the runs they are executing (at least 1)."""
    workers = live_workers()
    slots = sum(workers.values_list("concurrency", flat=True))
    busy = Run.objects.filter(status=RunStatus.RUNNING, worker__in=workers).count()
    return max(1, slots - busy)


def release_of(torch):
    """The release a torch version string stands for: "2.13.0+cpu" (a local build of the default environment)
    is release 2.13.0."""
    try:
        return Version(torch).public
    except InvalidVersion:
        return torch


def recorded_environments(release):
    """The PythonEnvironments recorded for torch ``release``, the default one first when it is that release (others
    have the same torch with other packages: ``torch==2.2.0,numpy<2``)."""
    default = default_environment()
    recorded = [environment for environment in PythonEnvironment.objects.filter(is_default=False).order_by("name")
                if release_of(environment.torch) == release_of(release)]
    return [default, *recorded] if release_of(default.torch) == release_of(release) else recorded


def fitting_environments(recorded, version):
    """Of ``recorded`` (one release's environments), those ``version`` runs in (runners.plans.runs_in: a
    reproducer that declares ``numpy<2`` runs in the environment that has it), or all of them when none fits."""
    return [environment for environment in recorded if runs_in(version, environment)] or recorded


def release_environment(release, versions=()):
    """The PythonEnvironment of torch ``release``, built here (runners.environments, cached per machine) when
    none is recorded: of several recorded, the one the most of ``versions`` run in (the first of those tied)."""
    recorded = recorded_environments(release)
    if not recorded:
        return build_environment([f"torch=={release}"])
    return max(recorded, key=lambda environment: (sum(runs_in(version, environment) for version in versions),
                                                  -recorded.index(environment)))


def probe_plan(version, environments, seeds, steps=None):
    """The runs of one round: ``version``'s buggy variant, plain, every seed, in each environment, whatever releases
    the reproducer declares (``needs.packages``, which ``CampaignPlan.build`` keeps to): a probe checks where the
    bug is, and a release on which the reproducer cannot run fails and is skipped. Its seeds and steps are checked
    as a bisection starts (evaluation.actions.do_start_bisection), its approval as the campaign is created."""
    detector = do_record_detector("plain")
    seeds = tuple(seeds)
    runs = tuple(PlannedRun(version, detector, Variant.BUGGY, seed, environment)
                 for environment in environments for seed in seeds)
    return CampaignPlan((version,), (detector,), (Variant.BUGGY,), seeds, steps, runs, tuple(environments))


def served_environments(version, releases):
    """([the environment of each release], [(release, its environment or None) that no live worker serves]): of
    the environments recorded for a release that ``version`` runs in (``fitting_environments``), the first in which
    a live worker consumes the queue of ``version``'s runs. Nothing is built: a worker that serves an environment
    has built and recorded it (SILENTBENCH_WORKER_ENVIRONMENTS)."""
    consumed = {queue for queues in live_workers().values_list("queues", flat=True) for queue in queues}
    environments, missing = [], []
    for release in releases:
        recorded = fitting_environments(recorded_environments(release), version)
        served = [environment for environment in recorded if queue_for(version, environment) in consumed]
        environments.append((served or recorded or [None])[0])
        if not served:
            missing.append((release, environments[-1]))
    return environments, missing


def not_served_reason(missing):
    """Why a round cannot start: the releases of ``missing`` (``served_environments``) that nobody serves."""
    names = ", ".join(f"torch {release}" + (f" ({environment.name})" if environment else " (no environment built)")
                      for release, environment in missing)
    requirements = ";".join(f"torch=={release}" for release, _ in missing)
    return (f"no live worker serves {names}: start a worker with SILENTBENCH_WORKER_ENVIRONMENTS=\"{requirements}\" "
            f"(docs/environments.md), or leave these releases out")
