"""Checking a submitted detector before anything is stored: its module, its config and its link in, every
problem out at once, each in a sentence that says what to change (docs/writing-a-detector.md).

Nothing here executes submitted code: the module is only parsed, and what the worker must know of the plugin
(its ``interface``: integration, default config, whether it instruments, analyzes or fits) is read from the
syntax tree, as literals. The code itself runs only inside a run's sandbox, after a maintainer approved it
(runners.detector_versions.submitted).
"""
import ast
import hashlib
import json
import re
from dataclasses import dataclass

from bugs.submissions import SubmissionLimits, read_uploads
from core.python_source import parse_python
from core.untrusted import storage_problem, text_problem

from ..detectors import all_plugins
from ..detectors.base import DROP_IN, INTEGRATIONS, OPT_IN

MAX_CONFIG_BYTES = 16 * 1024  # a config is a handful of thresholds
MAX_DESCRIPTION_CHARACTERS = 2000
MAX_TIME_LIMIT_FACTOR = 10
MAX_FIT_KEYS = 64  # fit_config_keys, and the names in a config's fit_pipelines
MAX_SEED = 2**32 - 1  # what numpy's and torch's seeding take
NAME_PATTERN = re.compile(r"^[a-z][a-z0-9_]{1,63}$")
VERSION_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,31}$")
# Class attributes the worker reads, as literals of the module: name -> (types, what it must be).
STATIC_ATTRIBUTES = {
    "name": ((str,), "a name in lower case: letters, digits and '_', starting with a letter (2-64 characters)"),
    "version": ((str,), "a version label of at most 32 letters, digits, '.', '_' or '-'"),
    "description": ((str,), "a sentence or two of text"),
    "integration": ((str,), f"one of {', '.join(map(repr, INTEGRATIONS))}"),
    "default_config": ((dict,), "a dict of JSON values"),
    "instruments": ((bool,), "True or False"),
    "needs_fit": ((bool,), "True or False"),
    "time_limit_factor": ((int, float), f"a number from 1 to {MAX_TIME_LIMIT_FACTOR}"),
    "fit_config_keys": ((tuple, list), f"a list or tuple of at most {MAX_FIT_KEYS} config key names (str)"),
}
REQUIRED_ATTRIBUTES = ("name", "version", "integration")
INTEGRATION_CONSTANTS = {"DROP_IN": DROP_IN, "OPT_IN": OPT_IN}  # base's names, read as their values
NOT_A_LITERAL = object()
HOOKS = {"install": True, "analyze": False, "fit": False}  # hook -> required
# What the worker itself calls or decides for a built-in plugin: a submitted one cannot change them, since its
# code never runs in the worker (runners.detector_versions.submitted).
WORKER_SIDE = ("command", "environment", "tool_version", "run_allowance", "config", "preload", "fit_family",
               "evaluated_by_default", "in_quickstart")


@dataclass(frozen=True)
class CheckedDetector:
    """A submission that passed every check: what ``do_submit_detector_version`` stores."""

    name: str
    version: str
    code: str
    code_hash: str
    config: dict
    interface: dict
    description: str


def code_hash(code):
    return hashlib.sha256(code.encode("utf-8")).hexdigest()


def _base_name(node):
    return node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""


def _plugin_classes(tree):
    return [node for node in tree.body if isinstance(node, ast.ClassDef)
            and any(_base_name(base) == "DetectorPlugin" for base in node.bases)]


def interface_problems(tree):
    """``(attributes, hooks, problems)`` of the module's one DetectorPlugin subclass: the literal values of its
    static attributes, the hooks it defines, and what is wrong."""
    classes = _plugin_classes(tree)
    if len(classes) != 1:
        return {}, set(), [f"The module must define exactly one class deriving from DetectorPlugin at its top level "
                           f"(it defines {len(classes)}): from runners.detectors import DetectorPlugin."]
    plugin = classes[0]
    attributes, hooks, problems = {}, set(), []
    for statement in plugin.body:
        if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if statement.name in WORKER_SIDE:
                problems.append(f"{plugin.name}.{statement.name}: the worker calls it, so a submitted detector "
                                f"cannot override it (docs/writing-a-detector.md says which hooks run in the sandbox).")
            elif statement.name in HOOKS:
                hooks.add(statement.name)
            continue
        targets = (statement.targets if isinstance(statement, ast.Assign)
                   else [statement.target] if isinstance(statement, ast.AnnAssign) else [])
        for target in targets:
            name = target.id if isinstance(target, ast.Name) else None
            if name in WORKER_SIDE:
                problems.append(f"{plugin.name}.{name}: the worker decides it, so a submitted detector cannot set it.")
            elif name in STATIC_ATTRIBUTES:
                constant = INTEGRATION_CONSTANTS.get(_base_name(statement.value))
                try:
                    attributes[name] = constant or ast.literal_eval(statement.value)
                except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                    attributes[name] = NOT_A_LITERAL
                    problems.append(f"{plugin.name}.{name} must be a literal ({STATIC_ATTRIBUTES[name][1]}): the "
                                    f"worker reads it without running the module.")
    for name, value in attributes.items():
        types, what = STATIC_ATTRIBUTES[name]
        if value is NOT_A_LITERAL:
            continue
        if not isinstance(value, types) or isinstance(value, bool) and bool not in types:
            problems.append(f"{plugin.name}.{name} must be {what}.")
    problems += [f"{plugin.name}.{name} is not set: it must be {STATIC_ATTRIBUTES[name][1]}."
                 for name in REQUIRED_ATTRIBUTES if name not in attributes]
    problems += [f"{plugin.name} does not define {hook}(self, ...): every detector implements it."
                 for hook, required in HOOKS.items() if required and hook not in hooks]
    return attributes, hooks, problems


def _value_problems(attributes, hooks):
    problems = []
    name, version = attributes.get("name"), attributes.get("version")
    if isinstance(name, str) and not NAME_PATTERN.match(name):
        problems.append(f"name {name[:80]!r}: {STATIC_ATTRIBUTES['name'][1]}.")
    if isinstance(version, str) and not VERSION_PATTERN.match(version):
        problems.append(f"version {version[:80]!r}: {STATIC_ATTRIBUTES['version'][1]}.")
    if isinstance(attributes.get("integration"), str) and attributes["integration"] not in INTEGRATIONS:
        problems.append(f"integration {attributes['integration'][:40]!r}: {STATIC_ATTRIBUTES['integration'][1]}.")
    factor = attributes.get("time_limit_factor", 1)
    if isinstance(factor, (int, float)) and not isinstance(factor, bool) and not 1 <= factor <= MAX_TIME_LIMIT_FACTOR:
        problems.append(f"time_limit_factor {factor}: {STATIC_ATTRIBUTES['time_limit_factor'][1]}.")
    keys = attributes.get("fit_config_keys", ())
    if isinstance(keys, (tuple, list)) and (len(keys) > MAX_FIT_KEYS or not all(isinstance(k, str) for k in keys)):
        problems.append(f"fit_config_keys: {STATIC_ATTRIBUTES['fit_config_keys'][1]}.")
    if isinstance(attributes.get("default_config"), dict):
        problems += config_problems(attributes["default_config"], "default_config")
    if attributes.get("needs_fit") and "fit" not in hooks:
        problems.append("needs_fit is True but the class does not define fit(self, programs, workdir, env, limits, "
                        "config).")
    if attributes.get("instruments", True) is False and "analyze" not in hooks:
        problems.append("instruments is False and the class defines no analyze(): such a detector can never alarm.")
    return problems


def config_problems(config, label="config"):
    """What keeps ``config`` from being a detector's config: a JSON object within ``MAX_CONFIG_BYTES``, whose
    keys that the worker itself reads (the fit's, runners.detector_versions.fitting) have the values it takes."""
    if not isinstance(config, dict):
        return [f"{label} must be a JSON object ({{\"key\": value, ...}})."]
    if problem := storage_problem(config):
        return [f"{label}: {problem}"]
    size = len(json.dumps(config).encode())
    if size > MAX_CONFIG_BYTES:
        return [f"{label}: {size} bytes of JSON, more than the {MAX_CONFIG_BYTES} allowed."]
    return _fit_config_problems(config, label)


def _fit_config_problems(config, label):
    problems = []
    pipelines = config.get("fit_pipelines")
    if pipelines is not None and (not isinstance(pipelines, list) or len(pipelines) > MAX_FIT_KEYS
                                  or not all(isinstance(name, str) for name in pipelines)):
        problems.append(f"{label}: fit_pipelines must be a list of at most {MAX_FIT_KEYS} clean reference "
                        f"pipelines' names (text), or null for all of them.")
    seed = config.get("fit_seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
        problems.append(f"{label}: fit_seed must be a whole number from 0 to {MAX_SEED}.")
    if config.get("fit_on_self", False) is not False:
        problems.append(f"{label}: fit_on_self must be false or left out. It fits on the fixed variant of the "
                        f"program under test, whose report names the trigger step the detector is scored against; a "
                        f"submitted detector fits on the clean reference pipelines.")
    return problems


def parse_config(text):
    """``(config, problems)`` of a config given as JSON text ('' is the empty config)."""
    if not text.strip():
        return {}, []
    if len(text.encode("utf-8", "replace")) > MAX_CONFIG_BYTES:
        return {}, [f"config: more than the {MAX_CONFIG_BYTES} bytes allowed."]
    try:
        config = json.loads(text)
    except (ValueError, RecursionError) as error:
        return {}, [f"config is not JSON: {error}."]
    return config, config_problems(config)


def check_detector(code, config=None, description=""):
    """``(CheckedDetector or None, problems)``: every problem of a submitted module and its config at once."""
    config = {} if config is None else config
    limit = SubmissionLimits.from_settings().max_file_bytes
    problems = config_problems(config)
    if not code.strip():
        return None, problems + ["No code: paste or upload the plugin module."]
    if problem := text_problem(code):
        return None, problems + [f"The module {problem}"]
    size = len(code.encode("utf-8"))
    if size > limit:
        return None, problems + [f"The module is {size // 1024} KiB, more than the {limit // 1024} KiB allowed."]
    if len(description) > MAX_DESCRIPTION_CHARACTERS:
        problems.append(f"description: more than {MAX_DESCRIPTION_CHARACTERS} characters.")
    tree, problem = parse_python("detector.py", code)
    if problem:
        return None, problems + [problem]
    attributes, hooks, found = interface_problems(tree)
    problems += found + _value_problems(attributes, hooks)
    if problems:
        return None, problems
    interface = {
        "integration": attributes["integration"],
        "default_config": attributes.get("default_config", {}),
        "instruments": attributes.get("instruments", True),
        "needs_fit": attributes.get("needs_fit", False),
        "time_limit_factor": attributes.get("time_limit_factor", 1),
        "fit_config_keys": list(attributes.get("fit_config_keys", ())),
        "analyze": "analyze" in hooks,
        "fit": "fit" in hooks,
    }
    description = description.strip() or attributes.get("description", "")
    if problem := storage_problem({"interface": interface, "description": description}):  # all that is stored
        return None, [f"The module's attributes cannot be stored: {problem}"]
    return CheckedDetector(name=attributes["name"], version=attributes["version"], code=code,
                           code_hash=code_hash(code), config=config, interface=interface,
                           description=description), []


# Names a detector cannot have: /detectors/<name>/ is its page, and these addresses are the site's own pages.
RESERVED_NAMES = ("submit", "mine", "review")


def name_problem(name):
    """A built-in detector's name is the repository's: its versions come from there, not from submissions; and a
    name whose page address is one of the site's (RESERVED_NAMES) is refused."""
    if name in all_plugins():
        return (f"{name!r} is a built-in detector; its versions come from the repository's runners/detectors/. "
                f"Give yours a name of its own.")
    if name in RESERVED_NAMES:
        return f"{name!r} is the name of one of the site's pages (/detectors/{name}/); give yours another."
    return ""


def read_module_upload(uploads):
    """``(code, problems)`` of an uploaded module, read within the reproducer submissions' limits
    (bugs.submissions.read_uploads): one Python file of UTF-8 text."""
    files, problems = read_uploads(uploads)
    if problems:
        return "", problems
    if len(files) != 1 or not next(iter(files)).endswith(".py"):
        return "", ["Upload the detector as one Python module (a .py file), not an archive or other files."]
    return next(iter(files.values())), []


def check_submission(code, uploads, config_text, description):
    """``(CheckedDetector or None, problems)`` of what a form or the API received: the module as text or as one
    uploaded file (``uploads``, a list; not both), the config as JSON text or already parsed."""
    problems = []
    if uploads:
        if code.strip():
            return None, ["Give the module either as text or as a file, not both."]
        code, problems = read_module_upload(uploads)
    if isinstance(config_text, str):
        config, config_found = parse_config(config_text)
    else:
        config, config_found = config_text, []
    if problems or config_found:
        return None, problems + config_found
    return check_detector(code, config, description)
