"""The fit phase of detectors that learn from clean programs (TrainCheck): pick the reference
pipelines, fit once, keep the result as a versioned artifact that every later run reuses."""
import hashlib
import json
import shutil
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from django.conf import settings

from core.enums import Variant

from ..actions.fits import do_store_fit_artifact
from ..execution import materialize, run_limits, scrubbed_environment
from ..failures import FitError, error_text
from ..models import FitArtifact
from ..selectors import runnable_versions
from .registry import plugin_for


def reference_versions(config, version):
    """The clean pipelines to fit on for a run of ``version``, never the program under test itself.

    ``fit_pipelines`` in the reproducer.yaml (the seed table's "Input To Infer Necessary Invariants")
    wins; else the detector config's ``fit_pipelines``; else every clean reference pipeline that runs on the CPU (not
    a CUDA one such as gpu-transformer, which a CPU worker could not run). The one
    exception is a config with ``fit_on_self`` (TrainCheck's paper protocol, evaluation.traincheck_protocols):
    the fixed variant of ``version`` itself, run at the config's ``fit_seed``, "a clean run of the same pipeline".
    """
    if config.get("fit_on_self"):
        return [version]
    names = version.manifest.get("fit_pipelines") or config.get("fit_pipelines")
    candidates = {v.reproducer.name: v for v in runnable_versions(pipelines=True)
                  if v.reproducer_id != version.reproducer_id}
    if not names:
        return [candidates[name] for name in sorted(candidates)]
    unknown = sorted(set(names) - set(candidates))
    if unknown:
        raise FitError(f"unknown or unusable reference pipeline(s) {', '.join(unknown)}; "
                       f"available: {', '.join(sorted(candidates)) or 'none'}")
    return [candidates[name] for name in sorted(set(names))]


def is_fit_reference(version, detector):
    """True when ``version`` is one of the clean pipelines that ``detector`` fits on by default: such a
    program is held out of the detector's evaluation (it would be fitted on its own behaviour)."""
    plugin = plugin_for(detector)
    names = plugin.config(detector.config).get("fit_pipelines") or []
    return plugin.needs_fit and version.reproducer.is_reference_pipeline and version.reproducer.name in names


def fit_key(detector, tool_version, versions):
    """What a fit depends on: the plugin's fit family and version, the config keys that shape the fit,
    the tool's version and the exact reference programs. Detectors that differ only in how they
    check (TrainCheck's selective and full collection) share one fit."""
    plugin = plugin_for(detector)
    config = plugin.config(detector.config)
    material = {"family": plugin.fit_family or plugin.name, "version": plugin.version, "tool": tool_version,
                "config": {key: config.get(key) for key in plugin.fit_config_keys},
                "references": sorted(v.content_hash for v in versions)}
    if detector.code_id is not None and not detector.code.builtin:  # a submitted version: its exact code
        material["code"] = detector.code.code_hash
    return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()


def ensure_fit(detector, version):
    """The detector's fit artifact for runs of ``version``: from the cache, or fitted now (and cached)."""
    plugin = plugin_for(detector)  # a submitted detector fits in a sandboxed process (.submitted)
    config = plugin.config(detector.config)
    references = reference_versions(config, version)
    if not references:
        raise FitError("there is no clean reference pipeline to fit on")
    tool_version = plugin.tool_version()
    key = fit_key(detector, tool_version, references)
    cached = FitArtifact.objects.filter(key=key).first()
    if cached:
        return cached

    settings.SILENTBENCH_RUN_DIR.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="fit-", dir=settings.SILENTBENCH_RUN_DIR))
    started = time.monotonic()
    try:
        (workdir / "tmp").mkdir()
        programs = []
        for index, reference in enumerate(references):
            program_dir = workdir / f"program-{index}"
            materialize(reference.files, program_dir)
            programs.append((program_dir, reference.entrypoint,
                             ["--variant", Variant.FIXED, "--seed", str(config.get("fit_seed", 0)),
                              "--steps", str(reference.default_steps)]))
        env = scrubbed_environment(workdir, workdir / "fit-report.jsonl", plugin.name, config, instrumented=False)
        longest = max(references, key=lambda v: v.time_limit_seconds)
        base = run_limits(longest)
        limits = replace(base, time_limit_seconds=base.time_limit_seconds * plugin.time_limit_factor)
        try:
            content, summary = plugin.fit(programs, workdir, env, limits, config)
        except RuntimeError as error:
            raise FitError(error_text(error)) from error
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    summary["references"] = [str(v.reproducer) for v in references]
    return do_store_fit_artifact(detector, key, tool_version, content, summary, round(time.monotonic() - started, 3),
                                 references)
