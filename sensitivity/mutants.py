"""The sensitivity track's mutants, generated from ``sensitivity/spec.yaml``: each is a clean pipeline of the catalog
with one fault operator armed at a severity and a trigger step, as a reproducer's files and manifest.

A mutant's program is its pipeline's own file with two lines changed, so that a reviewer's diff is those two lines:
after the module docstring, ``import silentbench_fault; silentbench_fault.install()``, and ``TRIGGER_STEP = None``
becomes the trigger step. Beside it: ``silentbench_fault.py`` (sensitivity/faults/harness.py),
``fault_operator.py`` (the operator's module) and ``mutant.json`` (what to inject). Its ``fixed`` variant arms
nothing: it is the clean twin.
"""
import ast
import importlib
import itertools
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from core.untrusted import load_yaml

PACKAGE = Path(__file__).resolve().parent
SPEC_PATH = PACKAGE / "spec.yaml"
OPERATORS_PACKAGE = f"{__package__}.faults.operators"
HARNESS_PATH = PACKAGE / "faults" / "harness.py"
HARNESS_FILE, OPERATOR_FILE, CONFIG_FILE = "silentbench_fault.py", "fault_operator.py", "mutant.json"
ENTRYPOINT = "repro.py"
ARMING_LINE = ("import silentbench_fault; silentbench_fault.install()  "
               "# SilentBench mutant: arms the fault (buggy variant only)")
TRIGGER_LINE = re.compile(r"^TRIGGER_STEP = None\b.*$", re.MULTILINE)
MUTANT_ID = re.compile(r"^MUT(-[a-z0-9]+)+$")
FAULT_CLASSES = ("software", "hardware")
OPERATOR_FIELDS = {"NAME": str, "FAULT_CLASS": str, "MIRRORS": str, "SUMMARY": str, "SEVERITIES": list,
                   "REQUIRES_ANY": tuple, "PERSISTENCE": tuple}


class SpecError(ValueError):
    """The spec or an operator module is wrong: the message names the file and what to fix."""


@dataclass(frozen=True)
class Operator:
    """A fault operator: one module of sensitivity/faults/operators, read for its metadata and shipped as source."""

    module: str
    name: str
    fault_class: str
    mirrors: str
    summary: str
    severities: list[tuple[str, dict[str, Any]]]  # from the least to the most harm
    requires_any: tuple[str, ...]
    persistence: tuple[str, ...]
    description: str
    source: str

    def applies_to(self, features):
        return not self.requires_any or bool(set(self.requires_any) & set(features))


@dataclass(frozen=True)
class Pipeline:
    name: str
    short: str
    features: tuple[str, ...]


@dataclass
class Mutant:
    """One mutant: its identity and fields, and the reproducer it becomes (``files`` and ``manifest``)."""

    mutant_id: str
    operator: Operator
    pipeline: Pipeline
    severity: str
    severity_level: int  # 1 = the operator's mildest severity
    parameters: dict[str, Any]
    trigger_step: int
    persistence: str
    rank: int
    steps: int
    files: dict[str, str] = field(default_factory=dict, repr=False)
    manifest: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def config(self):
        """What ``mutant.json`` holds: what the harness injects."""
        return {"mutant_id": self.mutant_id, "operator": self.operator.name, "severity": self.severity,
                "parameters": self.parameters, "trigger_step": self.trigger_step, "rank": self.rank,
                "persistence": self.persistence}


def load_operator(module_name):
    """The operator in ``sensitivity/faults/operators/<module_name>.py``; its metadata is checked."""
    try:
        module = importlib.import_module(f"{OPERATORS_PACKAGE}.{module_name}")
    except ImportError as error:
        raise SpecError(f"{SPEC_PATH.name}: no operator module {module_name!r} ({error})") from error
    return _operator(module_name, module)


def _operator(module_name: str, module: ModuleType) -> Operator:
    where = f"sensitivity/faults/operators/{module_name}.py"
    for name, kind in OPERATOR_FIELDS.items():
        if not isinstance(getattr(module, name, None), kind):
            raise SpecError(f"{where}: {name} must be a {kind.__name__}")
    if not callable(getattr(module, "inject", None)):
        raise SpecError(f"{where}: it must define inject(fault)")
    if module.FAULT_CLASS not in FAULT_CLASSES:
        raise SpecError(f"{where}: FAULT_CLASS must be one of {', '.join(FAULT_CLASSES)}")
    labels = [label for label, _ in module.SEVERITIES]
    if len(labels) < 4 or len(set(labels)) != len(labels):
        raise SpecError(f"{where}: SEVERITIES must name at least 4 distinct levels, from the least to the most harm")
    if not module.__doc__:
        raise SpecError(f"{where}: its docstring must say what the fault models and what its severity means")
    source = Path(module.__file__ or "").read_text(encoding="utf-8")
    return Operator(module=module_name, name=module.NAME, fault_class=module.FAULT_CLASS, mirrors=module.MIRRORS,
                    summary=module.SUMMARY, severities=list(module.SEVERITIES),
                    requires_any=tuple(module.REQUIRES_ANY), persistence=tuple(module.PERSISTENCE),
                    description=" ".join(module.__doc__.split()), source=source)


def read_spec(path=SPEC_PATH):
    spec = load_yaml(Path(path).read_text(encoding="utf-8"))
    if not isinstance(spec, dict) or not {"steps", "trigger_steps", "pipelines", "operators"} <= set(spec):
        raise SpecError(f"{path}: it must set steps, trigger_steps, pipelines and operators")
    return spec


def mutant_programs(catalog_root, spec_path=SPEC_PATH):
    """Every mutant the spec asks for, in a stable order, with its files and manifest."""
    spec = read_spec(spec_path)
    steps = int(spec["steps"])
    pipelines = [Pipeline(name, str(entry["short"]), tuple(entry.get("features") or ()))
                 for name, entry in spec["pipelines"].items()]
    harness = HARNESS_PATH.read_text(encoding="utf-8")
    mutants, seen = [], set()
    for entry in spec["operators"]:
        operator = load_operator(entry["module"])
        for pipeline in pipelines:
            if not operator.applies_to(pipeline.features):
                continue
            folder = Path(catalog_root) / "pipelines" / pipeline.name
            pipeline_manifest = load_yaml((folder / "reproducer.yaml").read_text(encoding="utf-8"))
            pipeline_source = (folder / pipeline_manifest["entrypoint"]).read_text(encoding="utf-8")
            rank = int(entry.get("rank", 0))
            world_size = int((pipeline_manifest.get("needs") or {}).get("world_size", 1))
            if not 0 <= rank < world_size:
                raise SpecError(f"{spec_path}: {entry['module']} strikes rank {rank}, but {pipeline.name} runs "
                                f"{world_size} rank{'s' if world_size > 1 else ''} (0 to {world_size - 1})")
            for trigger in spec["trigger_steps"]:
                if not 1 <= int(trigger) < steps:
                    raise SpecError(f"{spec_path}: trigger step {trigger} must lie in 1..{steps - 1}")
                for level, (severity, parameters) in enumerate(operator.severities, start=1):
                    for persistence in operator.persistence:
                        mutant = Mutant(
                            mutant_id=mutant_id(operator, severity, pipeline, int(trigger), persistence),
                            operator=operator, pipeline=pipeline, severity=severity, severity_level=level,
                            parameters=dict(parameters), trigger_step=int(trigger), persistence=persistence,
                            rank=rank, steps=steps)
                        if mutant.mutant_id in seen:
                            raise SpecError(f"{spec_path}: two mutants would be {mutant.mutant_id}")
                        seen.add(mutant.mutant_id)
                        mutant.files = {ENTRYPOINT: armed_source(pipeline_source, int(trigger), pipeline.name),
                                        HARNESS_FILE: harness, OPERATOR_FILE: operator.source,
                                        CONFIG_FILE: json.dumps(mutant.config, indent=2, sort_keys=True) + "\n"}
                        mutant.manifest = mutant_manifest(mutant, pipeline_manifest)
                        mutants.append(mutant)
    return mutants


def mutant_id(operator, severity, pipeline, trigger, persistence):
    words = [operator.name, severity, pipeline.short, f"t{trigger}"] + ([persistence] if persistence else [])
    identifier = "MUT-" + "-".join(words).lower()
    if not MUTANT_ID.match(identifier):
        raise SpecError(f"{operator.module}: the mutant ID {identifier!r} is not lower-case words joined by dashes")
    return identifier


def armed_source(pipeline_source, trigger, pipeline_name):
    """The pipeline's source with the arming line after its docstring and any ``from __future__`` imports (which
    must come first), and its trigger step set."""
    if len(TRIGGER_LINE.findall(pipeline_source)) != 1:
        raise SpecError(f"catalog/pipelines/{pipeline_name}: it must have one line 'TRIGGER_STEP = None'")
    tree = ast.parse(pipeline_source)
    first = tree.body[0] if tree.body else None
    if not (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
            and isinstance(first.value.value, str)):
        raise SpecError(f"catalog/pipelines/{pipeline_name}: it must open with its docstring")
    lines = pipeline_source.splitlines(keepends=True)
    opening = [first, *itertools.takewhile(
        lambda node: isinstance(node, ast.ImportFrom) and node.module == "__future__", tree.body[1:])]
    arming_at = opening[-1].end_lineno or 1
    source = "".join(lines[:arming_at]) + ARMING_LINE + "\n" + "".join(lines[arming_at:])
    return TRIGGER_LINE.sub(f"TRIGGER_STEP = {trigger}  # SilentBench mutant: the fault begins at this step", source)


def mutant_manifest(mutant, pipeline_manifest):
    persistence = f", {mutant.persistence}" if mutant.persistence else ""
    return {
        "entrypoint": ENTRYPOINT,
        "strategy": "injected",
        "strategy_note": (f"Mutant of the clean pipeline {mutant.pipeline.name}: {mutant.operator.summary} "
                          f"(severity {mutant.severity}{persistence}, from step {mutant.trigger_step})."),
        "simulated": False,
        "oracle": {
            "symptom": "reference_mismatch",
            "check": ("Judged against the clean twin of the same seed: manifested when the final loss or the "
                      "held-out metric moved further than the pipeline's seed-to-seed spread (the noise-calibrated "
                      "oracle). The pipeline's own record says only whether training visibly failed."),
        },
        "fidelity_note": (f"A fault injected at run time by the operator {mutant.operator.name} "
                          f"({mutant.operator.mirrors}), not a real bug: {mutant.operator.description}"),
        "default_steps": mutant.steps,
        "needs": dict(pipeline_manifest.get("needs") or {}),
        "mutant": {"operator": mutant.operator.name, "fault_class": mutant.operator.fault_class,
                   "severity": mutant.severity, "severity_level": mutant.severity_level,
                   "pipeline": mutant.pipeline.name, "trigger_step": mutant.trigger_step,
                   "persistence": mutant.persistence, "rank": mutant.rank},
    }
