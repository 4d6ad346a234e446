"""One way to turn choices into a campaign: ``CampaignPlan`` resolves names (bugs, pipelines, detectors)
into the exact approved versions and detector records, validates them, lists the runs, estimates their
time and names them by a digest. The campaign builder, the API, the commands (run_campaign, verify_bugs,
evaluate, quickstart) and the overhead measurement all build one, and ``do_create_campaign`` creates
exactly the runs it lists."""
import hashlib
import json
from dataclasses import dataclass

from django.core.exceptions import ValidationError
from django.db.models import Avg, F
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from core.enums import Variant

from .actions.detectors import do_record_detector, do_sync_detectors
from .detectors import campaign_plugins
from .environments.python_environments import default_environment
from .models import Run, RunStatus
from .selectors import runnable_versions

MAX_SEEDS = 100
MAX_SEED = 10**6  # the largest seed (the builder, the API): a Run.seed column holds it on every database
MAX_STEPS = 100_000


@dataclass(frozen=True)
class PlannedRun:
    version: object
    detector: object
    variant: str
    seed: int
    environment: object = None  # a PythonEnvironment; None: the default one


def declared_packages(version):
    """The requirements a reproducer version declares (``needs.packages``: ``["torch>=2.4"]``); a malformed
    one is left out (the catalog loader reports it)."""
    declared = (version.manifest.get("needs") or {}).get("packages") or []
    requirements = []
    for text in declared if isinstance(declared, list) else []:
        try:
            requirements.append(Requirement(str(text)))
        except InvalidRequirement:
            continue
    return requirements


def runs_in(version, environment):
    """Whether ``version`` runs in ``environment``, the default one included: when the environment has every package
    it declares (``needs.packages``) at a version its specifier allows (local labels such as ``+cpu`` aside, as pip
    compares them). A reproducer written for the release that still has its bug (``torch<2.3``) is not run where the
    bug is fixed, where it could only fail to reproduce."""
    for requirement in declared_packages(version):
        installed = environment.resolved.get(canonicalize_name(requirement.name))
        if installed is None or not requirement.specifier.contains(installed, prereleases=True):
            return False
    return True


@dataclass(frozen=True)
class CampaignPlan:
    """The runs of a campaign before it exists. Build one with :meth:`resolve` (from names) or
    :meth:`build` (from versions and detector records already chosen)."""

    versions: tuple
    detectors: tuple
    variants: tuple
    seeds: tuple
    steps: int | None
    runs: tuple
    environments: tuple = ()  # PythonEnvironments: the runs are their cross product with the rest

    @classmethod
    def resolve(cls, bugs=None, pipelines=(), detectors=None, variants=(Variant.BUGGY, Variant.FIXED), seeds=(0,),
                steps=None, cuda=False, skip=None, environments=None):
        """A plan from names. ``bugs`` None means every runnable bug, ``detectors`` None every detector;
        each bug runs its CPU reproducers (and its CUDA ones with ``cuda``) at their latest approved
        version; each named pipeline runs its fixed variant (one that needs CUDA only with ``cuda``, as a bug's
        CUDA reproducers); ``environments`` (PythonEnvironments, None: the
        default one) as in :meth:`build`. Raises ValidationError({field: [problems]}) with every problem at
        once: a bug with nothing approved to run, an unknown pipeline or detector..."""
        problems = {}
        versions = []
        if bugs is None or bugs:
            found = runnable_versions(bugs) + (runnable_versions(bugs, cuda=True) if cuda else [])
            versions += sorted(found, key=lambda v: (v.reproducer.bug.bug_id, v.reproducer.name))
            covered = {version.reproducer.bug.bug_id for version in found}
            missing = sorted(set(bugs or ()) - covered)
            if missing:
                what = "CPU or CUDA reproducer" if cuda else "CPU reproducer (CUDA ones need the CUDA option)"
                problems["bugs"] = [f"{bug_id}: no approved {what}" for bug_id in missing]
        if pipelines:
            known = {version.reproducer.name: version for version in runnable_versions(pipelines=True)}
            on_gpu = {version.reproducer.name: version for version in runnable_versions(pipelines=True, cuda=True)}
            if cuda:
                known.update(on_gpu)
            versions += [known[name] for name in sorted(set(pipelines)) if name in known]
            unknown = sorted(set(pipelines) - set(known))
            if unknown:
                problems["pipelines"] = [
                    f"{name}: a CUDA pipeline, which needs the CUDA option (and a GPU worker)" if name in on_gpu
                    else f"{name}: no such clean pipeline (there are {', '.join(sorted(known))})" for name in unknown]
        records = []
        if detectors is None:
            records = list(do_sync_detectors().values())
        else:
            named = campaign_plugins()
            unknown = sorted(set(detectors) - set(named))
            if unknown:
                problems["detectors"] = [f"unknown detector {name!r}; a campaign may name: {', '.join(named)}"
                                         for name in unknown]
            records = [do_record_detector(name) for name in dict.fromkeys(detectors) if name in named]
        try:
            plan = cls.build(versions, records, variants, seeds, steps, skip, environments)
        except ValidationError as error:
            for field, messages in error.message_dict.items():
                problems.setdefault(field, messages)  # "pick at least one" adds nothing to a named problem
            plan = None
        if problems:
            raise ValidationError(problems)
        return plan

    @classmethod
    def build(cls, versions, detectors, variants=(Variant.BUGGY, Variant.FIXED), seeds=(0,), steps=None, skip=None,
              environments=None, canaries=False):
        """Every combination of versions x detectors x variants x seeds x environments that can run: a clean
        pipeline has only its fixed variant, ``skip(version, detector)`` leaves out others (a detector's own
        fit references), and a version runs only in the environments that have the packages it declares
        (``needs.packages``: ``torch>=2.4``). ``environments`` None is the default one. Only approved versions
        are accepted, and never a historical one. ``canaries``: a clean pipeline also runs presented as buggy, the
        same clean program under the label a detector in its process could read (evaluation.integrity)."""
        variants, seeds = tuple(dict.fromkeys(variants)), tuple(sorted(set(seeds)))
        environments = tuple(dict.fromkeys(environments)) if environments is not None else (default_environment(),)
        problems = {}
        unapproved = [str(version) for version in versions if not version.is_approved]
        if unapproved:
            problems["versions"] = [f"Not approved by a maintainer, so they cannot run: {', '.join(unapproved)}"]
        historical = [str(version) for version in versions if version.reproducer.historical_reason]
        if historical:
            problems.setdefault("versions", []).append(
                f"Historical: no environment today can show their bugs, so they never run: {', '.join(historical)}")
        if not versions:
            problems.setdefault("bugs", []).append("Pick at least one bug or pipeline that has an approved reproducer.")
        if not detectors:
            problems["detectors"] = ["Pick at least one detector."]
        bad_variants = [variant for variant in variants if variant not in Variant.values]
        if not variants or bad_variants:
            problems["variants"] = [f"Pick buggy, fixed or both{f' (not {bad_variants})' if bad_variants else ''}."]
        if not seeds or len(seeds) > MAX_SEEDS or any(not 0 <= seed <= MAX_SEED for seed in seeds):
            problems["seeds"] = [f"Give between 1 and {MAX_SEEDS} seeds, each from 0 to {MAX_SEED}."]
        if steps is not None and not 1 <= steps <= MAX_STEPS:
            problems["steps"] = [f"Steps must be between 1 and {MAX_STEPS}."]
        if not environments:
            problems["environments"] = ["Pick at least one environment."]
        if problems:
            raise ValidationError(problems)
        # A seed's whole matrix first, column by column (a detector's runs over every program): a matrix fills in
        # the order a reader looks at it, and a program's runs are spread out, so that its first run (which compiles
        # with Inductor) has ended before the next one starts and leaves its kernels for the others
        # (runners.compile_cache) rather than two slots compiling the same ones at once.
        runs = tuple(PlannedRun(version, detector, variant, seed, environment)
                     for environment in environments for seed in seeds for detector in detectors
                     for version in versions if runs_in(version, environment) for variant in variants
                     if (variant in version.reproducer.variants
                         or canaries and version.reproducer.is_reference_pipeline and variant in Variant.values)
                     and not (skip and skip(version, detector)))
        if not runs:
            if not any(runs_in(version, environment) for environment in environments for version in versions):
                raise ValidationError({"environments": [
                    "No chosen reproducer declares packages (needs.packages) that these environments have: "
                    + ", ".join(f"{environment} (torch {environment.torch})" for environment in environments)]})
            raise ValidationError({"variants": ["These choices make no run (a clean pipeline has only its fixed "
                                                "variant)."]})
        return cls(tuple(versions), tuple(detectors), variants, seeds, steps, runs, environments)

    @classmethod
    def pairs(cls, workload, baseline, detectors, pairs, steps=None):
        """Overhead pairs: for each detector, ``pairs`` pairs of (baseline, detector) runs of the
        workload's fixed variant, each pair with its own baseline run and one seed on both sides."""
        runs = []
        for index, detector in enumerate(detectors):
            for pair in range(pairs):
                seed = index * pairs + pair
                runs += [PlannedRun(workload, baseline, Variant.FIXED, seed),
                         PlannedRun(workload, detector, Variant.FIXED, seed)]
        plan = cls.build([workload], [baseline, *detectors], [Variant.FIXED], range(len(detectors) * pairs), steps)
        return cls(plan.versions, plan.detectors, plan.variants, plan.seeds, steps, tuple(runs), plan.environments)

    @classmethod
    def bracketed(cls, workload, baseline, detectors, every, steps=None):
        """Overhead with a shared baseline: a baseline run, then ``every`` detectors' runs, then a baseline run again,
        and so on, ending on one, all of the workload's fixed variant with seed 0: each detector is timed once,
        against the baseline runs on either side of it (evaluation.overhead)."""
        runs = [PlannedRun(workload, baseline, Variant.FIXED, 0)]
        for start in range(0, len(detectors), every):
            runs += [PlannedRun(workload, detector, Variant.FIXED, 0) for detector in detectors[start:start + every]]
            runs.append(PlannedRun(workload, baseline, Variant.FIXED, 0))
        plan = cls.build([workload], [baseline, *detectors], [Variant.FIXED], [0], steps)
        return cls(plan.versions, plan.detectors, plan.variants, plan.seeds, steps, tuple(runs), plan.environments)

    def steps_of(self, version):
        return self.steps or version.default_steps

    @property
    def parameters(self):
        """What the campaign records of its plan."""
        return {"reproducers": [str(version) for version in self.versions],
                "detectors": [str(detector) for detector in self.detectors],
                "variants": list(self.variants), "seeds": list(self.seeds), "steps": self.steps,
                "environments": [environment.name for environment in self.environments]}

    def digest(self):
        """Names exactly these runs; the builder's confirm needs the digest its preview showed, so a
        campaign that was never previewed (choices changed, then Enter pressed) is not queued."""
        cells = sorted((run.version.pk, run.detector.pk, run.variant, run.seed, self.steps_of(run.version),
                        run.environment.pk if run.environment else 0) for run in self.runs)
        return hashlib.sha256(json.dumps(cells).encode()).hexdigest()[:16]

    def estimate(self):
        """How many runs and roughly how long they take on one worker slot.

        Each run is estimated by the mean wall time per step of earlier succeeded runs of the same
        reproducer under the same detector, else under any detector, times its steps; else a third of
        its time limit (a guess, and said so)."""
        reproducer_ids = {version.reproducer_id for version in self.versions}
        means = {}
        for reproducer_id, detector, seconds in (Run.objects.filter(
                status=RunStatus.SUCCEEDED, reproducer_version__reproducer_id__in=reproducer_ids)
                .values_list("reproducer_version__reproducer_id", "detector__name")
                .annotate(mean=Avg(F("wall_seconds") / F("steps")))):
            means[(reproducer_id, detector)] = seconds
            means.setdefault((reproducer_id, None), seconds)
        seconds, guessed = 0.0, 0
        for run in self.runs:
            reproducer_id = run.version.reproducer_id
            per_step = means.get((reproducer_id, run.detector.name), means.get((reproducer_id, None)))
            if per_step is None:
                seconds, guessed = seconds + run.version.time_limit_seconds / 3, guessed + 1
            else:
                seconds += per_step * self.steps_of(run.version)
        return {"runs": len(self.runs), "seconds": round(seconds), "guessed_runs": guessed}
