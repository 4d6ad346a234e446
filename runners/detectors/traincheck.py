"""TrainCheck (OSDI'25), the real ``traincheck`` package, run as an outer command.

fit: ``traincheck-collect`` runs each clean reference pipeline, ``traincheck-infer`` learns invariants
from their traces; the runner caches the result as a versioned artifact (``runners.detector_versions.fitting``).
check: ``traincheck-collect`` traces the reproducer (``selective``: only what the invariants need, or
``full``), then ``traincheck-check`` checks the trace; each violated invariant becomes one alarm at
the training step of its first violating trace record.

Every phase is a sealed run forked warm from a zygote that has imported torch and TrainCheck
(``TRAINCHECK_PRELOAD``: ``preload_traincheck``), so none pays the interpreter's, torch's or TrainCheck's start-up:
``traincheck-collect --only-instr`` writes TrainCheck's instrumented copy of the script
(``_traincheck_<name>.py``, beside it), the run executes that copy as ``__main__`` with the script's
arguments from TrainCheck's output directory, where the copy finds its instrumentation options (as
``traincheck-collect`` would, through a shell script and a new interpreter), then ``traincheck-check`` (or, to fit,
``traincheck-infer``) runs as ``__main__`` too. TorchScript is off (``PYTORCH_JIT=0``) in all of them, as
TrainCheck's own runner sets it. The ranks of a multi-rank program fork from the instrumented copy, each
starting a trace of its own (``ForkedRankTracer``).

The instrumented copy itself forks from a zygote that has also instrumented torch as the copy's first
``Instrumentor(torch, ...).instrument()`` would, with the same options and ``instr_opts.json``
(``instrumentation_spec``; ``INSTRUMENTED_PRELOAD``, one zygote per fit and collection mode), and has
then imported torch's compiler untraced, as the first optimizer would: the copy's own instrumentation then wraps
nothing more, and neither costs the run (about 2.8 and 2.5 s per traced process). A copy whose head does more
than import the standard library, TrainCheck and torch before that call instruments torch itself, as before.

Facts of traincheck 0.2.0 this module works around:
- its instrumented copy of the script has lost the module docstring;
- the ``sampler`` model tracker needs the model's variable name, and hooks the first line that
  assigns an optimizer built from it; we find that name in the source;
- ``traincheck-check`` exits 0 whether or not invariants fail: only ``failed.log`` tells;
- its step counter is the training-loop iteration, 1-based (0 before the loop): our step is one less,
  and a violation during setup gets step -1 (before any fault is active: a false alarm).
And one it cannot: its traces record the ``id()`` of the tensors a call receives and of a module's tensors,
so what it infers and checks on them (distinct arguments, ``*_ID`` variables) follows where objects happen to
lie in memory, and may differ between any two runs of one program, warm or cold.
It imports no Django: the registry also loads this module inside reproducer processes.
"""
import ast
import json
import os
import re
import shutil
import sys
import tempfile
import threading
import time
from importlib import metadata
from pathlib import Path

from ..executor import Preload, SandboxedProgramFailed, add_run_start_hook, run_sandboxed, spawn_by_fork_with
from .base import DROP_IN, DetectorPlugin, register

WORK_DIR = ".traincheck"
MAX_ALARMS = 500
MAX_SETUP_ALARMS = 50
INSTRUMENTED_PREFIX = "_traincheck_"  # TrainCheck's name for its instrumented copy of a script
TRAINCHECK_ENV = {"PYTORCH_JIT": "0"}  # what TrainCheck's runner sets for the programs it traces
# The zygotes TrainCheck's phases fork from (runners.executor.zygote): TrainCheck imported, and for a traced program,
# torch instrumented already (``preload_traincheck_instrumented``, with the copy's ``instrumentation_spec``).
TRAINCHECK_PRELOAD = Preload("traincheck", f"{__name__}:preload_traincheck", packages=("torch", "traincheck"),
                             env=tuple(TRAINCHECK_ENV.items()))
INSTRUMENTED_PRELOAD = Preload("traincheck-instrumented", f"{__name__}:preload_traincheck_instrumented",
                               packages=("torch", "traincheck"), env=tuple(TRAINCHECK_ENV.items()))
# What the head of an instrumented copy may set, as traincheck-collect writes it: a zygote outside the sandbox
# applies these (instrumentation_spec), so nothing else of the copy is taken.
HEAD_SETTINGS = {"INSTR_DESCRIPTORS": (bool,), "MODEL_TRACKER_STYLE": (str, type(None)), "USE_TORCH_COMPILE": (bool,)}
INSTRUMENTOR_OPTIONS = {"scan_proxy_in_args": (bool,), "use_full_instr": (bool,), "funcs_to_instr": (type(None),),
                        "API_dump_stack_trace": (bool,), "sampling_interval": (int, type(None)),
                        "warm_up_steps": (int, type(None))}
OPTIMIZER_LINE = re.compile(r"^[ \t]*\w+[ \t]*=[ \t]*[\w.]*\([ \t]*(\w+)(?:\.\w+)*\.parameters\(\)", re.MULTILINE)


class TrainCheckError(RuntimeError):
    """A TrainCheck phase did not complete; the message says which and why."""


class TrainCheckToolFailed(TrainCheckError, SandboxedProgramFailed):
    """One of TrainCheck's tools, run sealed, did not end well (runners.failures words how)."""


def tool_version():
    try:
        return metadata.version("traincheck")
    except metadata.PackageNotFoundError:
        return None


def tool_path(name):
    """A console script of the interpreter's environment (``traincheck-collect`` and friends)."""
    return str(Path(sys.executable).parent / name)


def models_to_track(source):
    """Variable names of the models whose optimizer TrainCheck's sampler can hook, or [] for API tracing only.

    The sampler hooks the first line of the *rewritten* source (``ast.unparse`` after TrainCheck's
    imports, which prints the module docstring on one line) that contains the model's name, ``=``
    and ``optimizer``. We take the model of the first ``x = SomeOptimizer(<model>[.sub].parameters(),
    ...)`` line (a later one may build a rank-0-only reference that rank 1 lacks), and only if
    TrainCheck would hook that very line; otherwise its hook would land in a docstring.
    """
    try:
        tree = ast.parse(source)
        tree.body.insert(0, ast.Pass())  # TrainCheck puts its imports first: the docstring becomes a plain string
        source = ast.unparse(tree)
    except SyntaxError:
        pass
    match = OPTIMIZER_LINE.search(source)  # the first optimizer built from a model's parameters
    if match is None:
        return []
    model = match.group(1)
    if not re.search(rf"^[ \t]*{re.escape(model)}[ \t]*=", source, re.MULTILINE):
        return []
    optimizer_line = source.count("\n", 0, match.start())
    lines = source.split("\n")
    first = next((i for i, line in enumerate(lines) if all(key in line for key in (model, "=", "optimizer"))), None)
    return [model] if first == optimizer_line else []


def tool_command(name, *args):
    """``python <console script> args``: a TrainCheck tool as a script, so that it can start warm."""
    return [sys.executable, tool_path(name), *args]


def instrument(workdir, entrypoint, output_dir, config, env, limits, invariants_file=None):
    """Have ``traincheck-collect`` write its instrumented copy of ``entrypoint`` (selective when given the
    invariants); returns (the copy's path, the models tracked)."""
    script = Path(workdir) / entrypoint
    argv = tool_command("traincheck-collect", "--only-instr", "--pyscript", str(script), "--output-dir",
                        str(output_dir), "--model-tracker-style", config["model_tracker_style"])
    models = models_to_track(script.read_text(encoding="utf-8", errors="replace"))
    if models:
        argv += ["--models-to-track", *models]
    if invariants_file is not None:
        argv += ["--invariants", str(invariants_file)]
    _run_tool(argv, workdir, env, limits, "instrument")
    copy = script.with_name(f"{INSTRUMENTED_PREFIX}{script.name}")
    if not copy.is_file():
        raise TrainCheckError(f"traincheck instrument wrote no {copy.name}")
    return copy, models


def instrumentation_spec(copy, output_dir):
    """What a zygote needs to instrument torch as TrainCheck's instrumented ``copy`` does first thing
    (``preload_traincheck_instrumented``), as JSON: the copy's ``general_config`` settings, the
    options of its ``Instrumentor`` calls and its ``instr_opts.json``. None, and the program instruments torch
    itself, unless the copy runs nothing before ``Instrumentor(torch, ...).instrument()`` but the standard library,
    TrainCheck and ``import torch``, and every ``Instrumentor`` call of it has the same options."""
    try:
        tree = ast.parse(Path(copy).read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError):
        return None
    config, first, torch_imported = {}, None, False
    for statement in tree.body:
        first = _instrumentor_call(statement)
        if first is not None:
            break
        setting = _config_setting(statement)
        if setting is not None:
            config.update([setting])
        elif not _runs_nothing_of_the_program(statement):
            return None
        torch_imported = torch_imported or (isinstance(statement, ast.Import)
                                            and any(alias.name == "torch" for alias in statement.names))
    if not (torch_imported and first is not None and isinstance(first.args[0], ast.Name)
            and first.args[0].id == "torch"):
        return None
    options = [_literal_keywords(call) for call in ast.walk(tree) if _is_instrumentor(call)]
    if None in options or any(option != options[0] for option in options):
        return None
    opts_file = Path(output_dir) / "instr_opts.json"
    return json.dumps({"config": config, "instrumentor": options[0],
                       "instr_opts": opts_file.read_text(encoding="utf-8") if opts_file.is_file() else None},
                      sort_keys=True)


def _is_instrumentor(node):
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "Instrumentor"


def _instrumentor_call(statement):
    """The ``Instrumentor(target, ...)`` of a statement ``Instrumentor(target, ...).instrument()``, else None."""
    call = statement.value if isinstance(statement, ast.Expr) else None
    if (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == "instrument"
            and _is_instrumentor(call.func.value) and len(call.func.value.args) == 1):
        return call.func.value
    return None


def _literal_keywords(call):
    """The options of an ``Instrumentor`` call, if each is one that TrainCheck writes, of its type; else None."""
    try:
        options = {keyword.arg: ast.literal_eval(keyword.value) for keyword in call.keywords}
    except ValueError:
        return None
    return options if _typed_as(options, INSTRUMENTOR_OPTIONS) else None


def _typed_as(values, types):
    return all(name in types and type(value) in types[name] for name, value in values.items())


def _config_setting(statement):
    """``general_config.NAME = <literal>`` as (NAME, value), else None."""
    if not (isinstance(statement, ast.Assign) and len(statement.targets) == 1):
        return None
    target = statement.targets[0]
    if not (isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name)
            and target.value.id == "general_config" and target.attr.isupper()):
        return None
    try:
        setting = {target.attr: ast.literal_eval(statement.value)}
    except ValueError:
        return None
    return next(iter(setting.items())) if _typed_as(setting, HEAD_SETTINGS) else None


def _runs_nothing_of_the_program(statement):
    """Whether a statement of the copy's head leaves torch alone: a string, an import of the standard library or
    TrainCheck, ``import torch``, TrainCheck's output folder, its debug hook, its stage annotation (which a script
    without a ``main()`` gets first thing)."""
    if isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant):
        return True
    if isinstance(statement, ast.Expr) and _is_stage_annotation(statement.value):
        return True
    if isinstance(statement, ast.Import):
        return all(alias.name == "torch" and alias.asname is None or _harmless_module(alias.name)
                   for alias in statement.names)
    if isinstance(statement, ast.ImportFrom):
        return statement.level == 0 and _harmless_module(statement.module or "")
    source = ast.unparse(statement)
    return (source.startswith("os.environ['TRAINCHECK_OUTPUT_DIR'] = ")
            or source.startswith("if os.environ.get('TRAINCHECK_DEBUG') == '1':"))


def _is_stage_annotation(node):
    """``annotate_stage("<literal>")``: TrainCheck's marker of a training stage, the same before or after torch is
    instrumented."""
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "annotate_stage"
            and not node.keywords and len(node.args) == 1 and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str))


def _harmless_module(name):
    root = name.partition(".")[0]
    return root in sys.stdlib_module_names or root in ("__future__", "traincheck")


def trace_folders(output_dir):
    return sorted({str(path.parent) for path in Path(output_dir).rglob("trace_*.log")})


def processes_traced(output_dir):
    """How many processes wrote a trace (TrainCheck names its files ``trace_<API|VAR>_<pid>_<thread>.log``)."""
    return len({path.name.split("_")[2] for path in Path(output_dir).rglob("trace_*_*_*.log")})


def read_json_stream(text):
    """The objects of a file of concatenated (pretty-printed) JSON values, as ``failed.log`` is."""
    decoder, objects, index = json.JSONDecoder(), [], 0
    while True:
        while index < len(text) and text[index].isspace():
            index += 1
        if index >= len(text):
            return objects
        value, index = decoder.raw_decode(text, index)
        objects.append(value)


def deployed_invariants(fit_artifact, top=None):
    """The invariants a run checks: every one of the fit (``top`` None), or only the ``top`` with the most positive
    examples, in the fit's order (config ``deploy_top``: the paper's selective checking deploys 100)."""
    if top is not None and (type(top) is not int or top < 1):
        raise TrainCheckError(f"deploy_top must be a whole number of at least 1, not {top!r}")
    lines = [line for line in fit_artifact.splitlines() if line.strip()]
    if top is None or len(lines) <= top:
        return fit_artifact
    support = [_positive_examples(line) for line in lines]
    kept = sorted(sorted(range(len(lines)), key=lambda index: -support[index])[:top])
    return "".join(f"{lines[index]}\n" for index in kept)


def _positive_examples(line):
    """An invariant's count of positive examples; 0 when the fit wrote anything else (it ran in the sandbox)."""
    try:
        count = json.loads(line).get("num_positive_examples")
    except (ValueError, AttributeError):
        return 0
    return count if type(count) in (int, float) else 0


def violation_alarms(failed, step_times):
    """One alarm per violated invariant, at the step of its earliest violating trace record.

    ``step_times`` maps our step to the Unix time at which it ended (rank 0); TrainCheck's own
    clock is monotonic, so the alarm takes the time of its step.
    """
    process_ids = sorted({record.get("process_id") for violation in failed for record in violation.get("trace", [])
                          if isinstance(record.get("process_id"), int)})
    alarms = []
    for violation in failed:
        invariant = violation.get("invariant", {})
        records = [r for r in violation.get("trace", []) if isinstance(r.get("meta_vars.step"), (int, float))]
        first = min(records, key=lambda r: (r["meta_vars.step"], r.get("time") or 0), default={})
        traincheck_step = int(first.get("meta_vars.step", 0))
        step = traincheck_step - 1  # -1: during setup, before the first training step
        process_id = first.get("process_id")
        description = str(invariant.get("text_description", ""))
        alarms.append({
            "step": step,
            # TrainCheck records process IDs, not ranks: ranks are spawned in order, so PIDs sort like ranks
            "rank": process_ids.index(process_id) if process_id in process_ids else 0,
            "rule": f"{invariant.get('relation', 'Invariant')}: {description}"[:200],
            "message": f"TrainCheck invariant violated: {description}"[:2000],
            "evidence": {"relation": invariant.get("relation"), "traincheck_step": traincheck_step,
                         "process_id": process_id, "stage": first.get("meta_vars.stage"),
                         "num_positive_examples": invariant.get("num_positive_examples")},
            "time": step_times.get(step),
        })
    alarms.sort(key=lambda alarm: alarm["step"])
    setup = [alarm for alarm in alarms if alarm["step"] < 0][:MAX_SETUP_ALARMS]  # a cap that leaves room for
    return setup + [alarm for alarm in alarms if alarm["step"] >= 0][:MAX_ALARMS - len(setup)]  # training steps


class ForkedRankTracer:
    """TrainCheck's tracer in a rank forked from the traced program (the ranks of a warm run).

    TrainCheck keeps per process, in thread-locals and module globals: its trace buffers, the queues of its
    writer threads, the process ID it stamps on records and the UUID of its call IDs. A fork copies them but
    not the threads, so a forked rank would write into queues that nobody drains, under its parent's ID.
    ``start`` (in the child, as it is forked) drops that state, so the rank opens trace files of its own as a
    newly started rank does;
    ``finish`` does what TrainCheck does at interpreter exit, which a forked rank (ending in ``os._exit``)
    never reaches: flush the buffers, stop the writers and wait for them to drain their queues.
    """

    PER_THREAD = {
        "traincheck.instrumentor.dumper": ("api_trace_buffer", "var_trace_buffer", "API_trace_dumper_queue",
                                           "VAR_trace_dumper_queue"),
        "traincheck.instrumentor.tracer": ("process_id", "thread_id"),
        "traincheck.utils": ("PROCESS_UUID",),
    }
    THREAD_LOCALS = {"traincheck.instrumentor.dumper": "THREAD_DATA", "traincheck.instrumentor.tracer": "THREAD_DATA",
                     "traincheck.utils": "THREAD_LOCAL"}

    @classmethod
    def start(cls):
        for module_name, names in cls.PER_THREAD.items():
            state = getattr(sys.modules[module_name], cls.THREAD_LOCALS[module_name])
            for name in names:
                state.__dict__.pop(name, None)
        dumper = sys.modules["traincheck.instrumentor.dumper"]
        dumper.stop_event = threading.Event()  # the parent's could be mid-use by one of its threads
        dumper.monitoring_thread = None

    @staticmethod
    def finish():
        dumper = sys.modules["traincheck.instrumentor.dumper"]
        for name in ("api_trace_buffer", "var_trace_buffer"):
            buffer = getattr(dumper.THREAD_DATA, name, None)
            if buffer is not None:
                buffer._flush()
        dumper.stop_event.set()  # writers end once their queue has been empty for two flush intervals
        for thread in threading.enumerate():  # as the interpreter does at exit: wait for the non-daemon threads
            if not thread.daemon and thread not in (threading.current_thread(), dumper.monitoring_thread):
                thread.join()


def preload_traincheck():
    """What each of TrainCheck's phases imports first: torch, then TrainCheck's instrumentor, collector,
    checker and inference engine. Nothing more of torch: TrainCheck instruments the torch modules loaded
    when the program starts, so a warm run must find the ones a cold run would (no optimizer warm-up).

    Ranks fork from the traced program, already instrumented, and each starts a trace of its own
    (``ForkedRankTracer``)."""
    import torch  # noqa: F401
    import traincheck.checker  # noqa: F401
    import traincheck.collect_trace  # noqa: F401
    import traincheck.infer_engine  # noqa: F401
    import traincheck.instrumentor.tracer  # noqa: F401

    spawn_by_fork_with(ForkedRankTracer)


def preload_traincheck_instrumented(spec_path):
    """``preload_traincheck``, then torch instrumented as TrainCheck's instrumented copy of a program would
    instrument it first thing (``instrumentation_spec``: the copy's settings, the options of its ``Instrumentor``
    calls and its ``instr_opts.json``), then the first optimizer's imports, untraced.

    In a program forked from here the copy's own ``Instrumentor(...).instrument()`` calls wrap nothing more and
    return at once (TrainCheck skips what it has instrumented), and its first optimizer finds ``torch._dynamo``
    imported. Only the order differs from a cold run: torch's compiler is imported *after* instrumentation, as the
    cold run imports it, so the same functions are wrapped (importing it first wraps 5,167 more); but the calls torch
    makes while importing it are not traced, in fitting and checking alike."""
    preload_traincheck()
    import torch
    import traincheck.config.config as traincheck_config
    from traincheck.instrumentor.tracer import Instrumentor

    with open(spec_path, encoding="utf-8") as source:
        spec = json.load(source)
    for name, value in spec["config"].items():
        setattr(traincheck_config, name, value)
    scratch, home = tempfile.mkdtemp(prefix="zygote-traincheck-"), os.getcwd()
    os.environ["TRAINCHECK_OUTPUT_DIR"] = scratch  # the zygote's own instrumentation log, removed below
    os.chdir(scratch)
    try:
        if spec["instr_opts"] is not None:  # read once by the first Instrumentor, kept by TrainCheck for the process
            Path(scratch, traincheck_config.INSTR_OPTS_FILE).write_text(spec["instr_opts"], encoding="utf-8")
        Instrumentor(torch, **spec["instrumentor"]).instrument()
        traincheck_config.DISABLE_WRAPPER = True
        try:
            torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)  # imports torch._dynamo (warm_torch)
        finally:
            traincheck_config.DISABLE_WRAPPER = False
    finally:
        os.chdir(home)
        os.environ.pop("TRAINCHECK_OUTPUT_DIR", None)
        shutil.rmtree(scratch, ignore_errors=True)
    add_run_start_hook(ForkedRankTracer.start)  # a run forked from here starts a trace of its own


def traced_program_preload(copy, output_dir):
    """The zygote to fork an instrumented copy from: one with torch instrumented already, when the copy allows it."""
    spec = instrumentation_spec(copy, output_dir)
    return TRAINCHECK_PRELOAD if spec is None else INSTRUMENTED_PRELOAD.with_argument(spec)


def _run_tool(argv, workdir, env, limits, phase, preload=TRAINCHECK_PRELOAD):
    result = run_sandboxed(argv, workdir, env, limits, warm=limits.warm_start, preload=preload)
    if result.ending() is not None:
        raise TrainCheckToolFailed(f"traincheck {phase}", result, limits)
    return result


@register
class TrainCheck(DetectorPlugin):
    name = "traincheck"
    version = "1"
    integration = DROP_IN  # TrainCheck instruments its own copy of the unmodified script
    description = ("TrainCheck (traincheck 0.2.0): invariants inferred from clean reference pipelines, checked on a "
                   "selective trace of the run. One alarm per violated invariant.")
    default_config = {
        "collection": "selective",  # "selective": trace only what the invariants need; "full": trace everything
        "model_tracker_style": "sampler",  # fit and check must use the same style
        # reference pipelines to fit on, unless the reproducer names its own; the other pipelines stay held out
        # to measure false positives on programs not used to fit (None: every pipeline but the one under test)
        "fit_pipelines": ["cnn-sgd-momentum", "ddp-gloo", "lstm-lm", "mlp-adam"],
        "fit_seed": 0,
        # Optional, absent by default: "deploy_top": N checks only the N best-supported invariants
        # (deployed_invariants); "fit_on_self": True fits on the fixed variant of the program under test
        # (runners.detector_versions.fitting.reference_versions). Both serve the paper's protocol
        # (evaluation.traincheck_protocols).
    }
    instruments = False  # no probe: TrainCheck's instrumented copy of the script runs instead
    preload = TRAINCHECK_PRELOAD
    needs_fit = True
    fit_family = "traincheck"
    fit_config_keys = ("model_tracker_style", "fit_seed")
    time_limit_factor = 8  # tracing every torch API call makes a run several times slower

    def tool_version(self):
        return tool_version() or ""

    def environment(self, config):
        return dict(TRAINCHECK_ENV)

    def command(self, argv, context):
        base = context.workdir / WORK_DIR
        base.mkdir(exist_ok=True)
        config = self.config(context.config)
        invariants = base / "invariants.json"
        invariants.write_text(deployed_invariants(context.fit_artifact, config.get("deploy_top")))
        started = time.monotonic()
        copy, models = instrument(context.workdir, context.entrypoint, base / "collect", config, context.env,
                                  context.limits, invariants if config["collection"] == "selective" else None)
        context.preload = traced_program_preload(copy, base / "collect")
        context.summary.update({"models_tracked": models, "instrument_seconds": round(time.monotonic() - started, 3)})
        context.cwd = base / "collect"  # the copy reads its instrumentation options from there
        return [argv[0], str(copy), *argv[2:]]

    def analyze(self, context, report):
        base = context.workdir / WORK_DIR
        invariants = base / "invariants.json"
        checked = deployed_invariants(context.fit_artifact, self.config(context.config).get("deploy_top"))
        invariants.write_text(checked)  # the run could rewrite its copy: check against the fit's own
        folders = trace_folders(base / "collect")
        deployed = sum(1 for line in checked.splitlines() if line.strip())
        context.summary.update({"rules_deployed": deployed, "trace_folders": len(folders),
                                "processes_traced": processes_traced(base / "collect")})
        if not folders:
            raise TrainCheckError("traincheck collect left no trace to check")
        started = time.monotonic()
        _run_tool(tool_command("traincheck-check", "--trace-folders", *folders, "--invariants", str(invariants),
                               "--output-dir", str(base / "check"), "--no-html-report"),
                  context.workdir, context.env, context.limits, "check")
        context.summary["check_seconds"] = round(time.monotonic() - started, 3)
        failed = []
        for log in sorted((base / "check").rglob("failed.log")):
            failed += read_json_stream(log.read_text(encoding="utf-8", errors="replace"))
        context.summary["rules_failed"] = len({json.dumps(v.get("invariant"), sort_keys=True) for v in failed})
        step_times = {s["step"]: s["time"] for s in report.steps if s["rank"] == 0}
        return violation_alarms(failed, step_times)

    def fit(self, programs, workdir, env, limits, config):
        """Collect a trace of every ``(directory, entrypoint, args)`` program, infer invariants from all.

        Returns the invariants file's text and a summary with the phase timings.
        """
        config = self.config(config)
        workdir, env = Path(workdir), {**env, **self.environment(config)}
        traces, tracked, started = [], {}, time.monotonic()
        for index, (program_dir, entrypoint, args) in enumerate(programs):
            output_dir = workdir / f"trace-{index}"
            copy, models = instrument(program_dir, entrypoint, output_dir, config, env, limits)
            tracked[f"{index}:{entrypoint}"] = models
            _run_tool([sys.executable, str(copy), *args], output_dir, env, limits,
                      f"collect on reference program {entrypoint} ({index + 1}/{len(programs)})",
                      traced_program_preload(copy, output_dir))
            traces += trace_folders(output_dir)
        collect_seconds = time.monotonic() - started
        invariants = workdir / "invariants.json"
        started = time.monotonic()
        _run_tool(tool_command("traincheck-infer", "--trace-folders", *traces, "--output", str(invariants)),
                  workdir, env, limits, "infer")
        text = invariants.read_text(encoding="utf-8") if invariants.exists() else ""
        relations = {}
        for line in text.splitlines():
            if line.strip():
                relation = json.loads(line).get("relation", "?")
                relations[relation] = relations.get(relation, 0) + 1
        if not relations:
            raise TrainCheckError("traincheck infer produced no invariants")
        return text, {"invariants": sum(relations.values()), "by_relation": relations,
                      "collect_seconds": round(collect_seconds, 3), "models_tracked": tracked,
                      "infer_seconds": round(time.monotonic() - started, 3), "traincheck": self.tool_version()}


@register
class TrainCheckFull(TrainCheck):
    name = "traincheck_full"
    evaluated_by_default = False  # 54 % of the published evaluation's run time: run it by name
    description = ("TrainCheck with full trace collection: every torch API call and model variable is traced, "
                   "then checked against the same invariants as selective collection; much slower.")
    default_config = {**TrainCheck.default_config, "collection": "full"}
