"""Python environments that runs can ask for: an interpreter with pinned packages, a torch release above all.

An environment is built by uv from pip requirements (``["torch==2.11.0"]``) on the worker that serves it: uv
resolves them (``uv pip compile``), the environment is named by what they resolved to (``py3.11-torch2.11.0``),
and a virtual environment of exactly that resolution is made under SILENTBENCH_ENVIRONMENTS_DIR/<name>, on the
worker's own base interpreter, its files hard-linked from uv's cache (SILENTBENCH_UV_CACHE_DIR), which every
build on the machine shares. A build is made once per machine: a finished one holds a marker file
(``BUILT_MARKER``) with what it resolved to, its build time and its size; a later build of the same
requirements finds it and builds nothing, without asking the package index again (so requirements that are
not exact pins keep their first resolution until the folder is removed). Each build is recorded
(``EnvironmentBuild``).

The *default* environment is the workers' own interpreter (the torch the project pins): nothing is built for it,
and its runs go to the queues without an environment (runners.environments.routing).
"""
import fcntl
import hashlib
import json
import os
import re
import shutil
import socket
import stat
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

from django.conf import settings
from django.db import transaction
from django.utils import timezone
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from uv import find_uv_bin  # uv as the project installs it (a dependency in pyproject.toml)

from ..failures import Unservable, environment_not_built
from ..models import EnvironmentBuild, PythonEnvironment, Worker
from .host import RECORDED_PACKAGES, host_facts

BUILT_MARKER = ".silentbench-environment.json"
BUILD_TIMEOUT_SECONDS = 3600  # a first build downloads torch and CUDA's wheels (about 3 GB)
# Run with the environment's interpreter once it is built: what it really imports, not what the resolver said.
INSPECT = ("import importlib.metadata as m, json, sys, torch; print(json.dumps({'python': '%d.%d.%d' % "
           "sys.version_info[:3], 'torch': torch.__version__, 'packages': {d.metadata['Name']: d.version "
           "for d in m.distributions()}}))")
# What the environment of uv's commands keeps from the worker's: where to find things, and how to reach an index.
UV_ENV_PASSED = ("PATH", "HOME", "LANG", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy",
                 "no_proxy", "SSL_CERT_FILE", "SSL_CERT_DIR", "UV_INDEX_URL", "UV_DEFAULT_INDEX", "UV_EXTRA_INDEX_URL",
                 "UV_INDEX", "UV_OFFLINE")


class EnvironmentBuildError(Unservable):
    """An environment could not be built, or is not built on this machine; the message says why. A run that asks
    for it cannot be served here."""


def parse_requirements(requirements):
    """Canonical requirement strings (``torch==2.11.0``), duplicates dropped; ValueError for a malformed one or
    a list that pins no torch (every run imports it)."""
    parsed = []
    for text in requirements:
        try:
            parsed.append(Requirement(str(text).strip()))
        except InvalidRequirement as error:
            raise ValueError(f"{text!r} is not a pip requirement: {error}") from None
    if not any(canonicalize_name(requirement.name) == "torch" for requirement in parsed):
        raise ValueError(f"An environment needs a torch requirement (e.g. torch==2.11.0); got {list(requirements)}.")
    return list(dict.fromkeys(str(requirement) for requirement in parsed))


def environment_name(python, requested, resolved):
    """``py3.11-torch2.11.0``: the interpreter's minor version, then torch's resolved version and every other
    requested package's, in name order; a local version label's ``+`` becomes ``_`` (``torch2.13.0_cpu``), as
    every broker takes the name in a queue's (runners.environments.routing)."""
    names = sorted({canonicalize_name(name) for name in requested} - {"torch"})
    parts = [f"py{'.'.join(python.split('.')[:2])}", f"torch{resolved['torch']}"]
    parts += [f"{name}{resolved[name]}" for name in names]
    return re.sub(r"[^A-Za-z0-9._-]", "_", "-".join(parts))


def _distributions():
    return {canonicalize_name(dist.metadata["Name"]): dist.version for dist in metadata.distributions()
            if dist.metadata["Name"]}


DEFAULT_SUFFIX = "-default"


def default_environment():
    """The record of the workers' own interpreter (this process's: the project pins the same torch everywhere),
    made on first use, and never another record: when a built environment already has the name the default's
    packages give (one built with the same torch and nothing else), the default's is that name and
    ``DEFAULT_SUFFIX``."""
    existing = PythonEnvironment.objects.filter(is_default=True).first()
    if existing is not None:
        return existing
    python = "%d.%d.%d" % sys.version_info[:3]
    resolved = _distributions()
    name = environment_name(python, ["torch"], resolved)
    if PythonEnvironment.objects.filter(name=name, is_default=False).exists():
        name += DEFAULT_SUFFIX
    environment, _ = PythonEnvironment.objects.get_or_create(
        name=name, is_default=True,
        defaults={"requirements": [], "resolved": resolved, "python": python, "torch": resolved.get("torch", "")})
    return environment


def is_default(environment):
    """A run with no environment, or the default one, runs on the worker's own interpreter."""
    return environment is None or environment.is_default


def base_interpreter():
    """The interpreter environments are built on: the worker's own base Python (its venv's, not the venv)."""
    return Path(sys.base_prefix, "bin", "python%d.%d" % sys.version_info[:2])


def _uv(arguments, stdin=None):
    env = {name: os.environ[name] for name in UV_ENV_PASSED if name in os.environ}
    env.update({"UV_CACHE_DIR": str(settings.SILENTBENCH_UV_CACHE_DIR), "UV_LINK_MODE": "hardlink",
                "UV_PYTHON_DOWNLOADS": "never", "UV_NO_CONFIG": "1"})
    try:
        result = subprocess.run([find_uv_bin(), *arguments], input=stdin, capture_output=True, text=True, env=env,
                                timeout=BUILD_TIMEOUT_SECONDS)
    except subprocess.TimeoutExpired:
        raise EnvironmentBuildError(f"uv {arguments[0]} {arguments[1] if len(arguments) > 1 else ''} took longer "
                                    f"than {BUILD_TIMEOUT_SECONDS} s") from None
    if result.returncode != 0:
        detail = (result.stderr.strip() or result.stdout.strip())[-2000:]
        raise EnvironmentBuildError(f"uv {' '.join(arguments[:2])} failed: {detail}")
    return result.stdout


def resolve(requirements):
    """What ``requirements`` resolve to on the base interpreter: the ``name==version`` lines uv pins."""
    output = _uv(["pip", "compile", "-", "--python", str(base_interpreter()), "--no-header", "--no-annotate",
                  "--quiet"], stdin="\n".join(requirements) + "\n")
    return [line.strip() for line in output.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def _pinned(lines):
    pins = {}
    for line in lines:
        name, _, version = line.partition("==")
        pins[canonicalize_name(name)] = version.split(";")[0].strip()
    return pins


def directory_size(path):
    """Bytes of the regular files under ``path``, each file once (hard links inside it counted once)."""
    seen, total = set(), 0
    for directory, _, files in os.walk(path):
        for name in files:
            info = os.lstat(os.path.join(directory, name))
            if not stat.S_ISREG(info.st_mode) or (info.st_dev, info.st_ino) in seen:
                continue
            seen.add((info.st_dev, info.st_ino))
            total += info.st_size
    return total


def environment_dir(name):
    return Path(settings.SILENTBENCH_ENVIRONMENTS_DIR) / name


def environment_python(environment):
    """The interpreter of ``environment`` on this machine: the worker's own for the default one; for another,
    its built environment's, or EnvironmentBuildError when it is not built here."""
    if is_default(environment):
        return Path(sys.executable)
    built_marker(environment)
    return environment_dir(environment.name) / "bin" / "python"


def built_marker(environment):
    """What the build of ``environment`` on this machine recorded (its ``BUILT_MARKER``); EnvironmentBuildError
    when it is not built here."""
    try:
        return json.loads((environment_dir(environment.name) / BUILT_MARKER).read_text())
    except FileNotFoundError:
        raise EnvironmentBuildError(environment_not_built(environment.name)) from None


def inspect_interpreter(python, directory):
    """What ``python`` reports once it has imported torch (``INSPECT``), run in ``directory``."""
    result = subprocess.run([str(python), "-W", "ignore", "-c", INSPECT], capture_output=True, text=True,
                            timeout=300, env={"PATH": "/usr/bin:/bin", "HOME": str(directory)}, cwd=directory)
    if result.returncode != 0:
        raise EnvironmentBuildError(f"{python} does not import torch: {result.stderr.strip()[-2000:]}")
    return json.loads(result.stdout)


def _build(requirements, pins, directory):
    """A virtual environment of exactly ``pins`` at ``directory``; returns what its interpreter reports."""
    shutil.rmtree(directory, ignore_errors=True)  # a build that stopped half-way
    _uv(["venv", str(directory), "--python", str(base_interpreter()), "--no-project", "--quiet"])
    pinned = directory / "requirements.txt"
    pinned.write_text("".join(f"{line}\n" for line in pins))
    _uv(["pip", "sync", str(pinned), "--python", str(directory / "bin" / "python"), "--quiet"])
    return inspect_interpreter(directory / "bin" / "python", directory)


def build_environment(requirements, worker=None):
    """The environment of ``requirements`` (pip requirement strings), built on this machine unless it already is;
    returns its PythonEnvironment. Records the build (EnvironmentBuild: its time and size) for this host.
    Raises ValueError for bad requirements and EnvironmentBuildError when uv or the environment fails."""
    requirements = parse_requirements(requirements)
    for marker in sorted(Path(settings.SILENTBENCH_ENVIRONMENTS_DIR).glob(f"*/{BUILT_MARKER}")):
        built = json.loads(marker.read_text())
        if built["requirements"] == requirements:  # resolved once: found without the package index
            return do_record_build(marker.parent.name, built, marker.parent, worker)
    pins = resolve(requirements)
    pinned = _pinned(pins)
    if "torch" not in pinned:
        raise EnvironmentBuildError(f"{requirements} resolved to no torch: {pins}")
    name = environment_name("%d.%d.%d" % sys.version_info[:3], [Requirement(r).name for r in requirements], pinned)
    directory = environment_dir(name)
    directory.parent.mkdir(parents=True, exist_ok=True)
    with open(directory.parent / f".{name}.lock", "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one build at a time per environment; the others then find it built
        marker = directory / BUILT_MARKER
        if marker.exists():
            built = json.loads(marker.read_text())
        else:
            started = time.monotonic()
            inspected = _build(requirements, pins, directory)
            resolved = {canonicalize_name(key): value for key, value in inspected["packages"].items()}
            # torch's version as its package metadata says (2.11.0), as the host facts read it; what it calls
            # itself on import (2.11.0+cu130: a CUDA build from the package index) is kept beside it.
            built = {"requirements": requirements, "python": inspected["python"], "torch": resolved["torch"],
                     "torch_build": inspected["torch"], "resolved": resolved,
                     "build_seconds": round(time.monotonic() - started, 1), "size_bytes": directory_size(directory),
                     "built_at": timezone.now().isoformat()}
            written = directory / f"{BUILT_MARKER}.partial"  # whole or absent: a killed build leaves no marker
            written.write_text(json.dumps(built, indent=1, sort_keys=True))
            os.replace(written, marker)
    return do_record_build(name, built, directory, worker)


def do_record_build(name, built, directory, worker=None):
    """Record the environment ``name`` and its build on this host at ``directory`` (``built``: its marker)."""
    with transaction.atomic():
        environment, _ = PythonEnvironment.objects.get_or_create(
            name=name, defaults={"requirements": built["requirements"], "resolved": built["resolved"],
                                 "python": built["python"], "torch": built["torch"]})
        EnvironmentBuild.objects.update_or_create(
            host=socket.gethostname(), path=str(directory),
            defaults={"environment": environment, "worker": worker, "build_seconds": built["build_seconds"],
                      "size_bytes": built["size_bytes"], "built_at": built["built_at"]})
    return environment


def worker_environments():
    """Build the environments this worker is configured to serve (SILENTBENCH_WORKER_ENVIRONMENTS), in order."""
    return [build_environment(requirements) for requirements in settings.SILENTBENCH_WORKER_ENVIRONMENTS]


def do_advertise_environments(worker, environments):
    """``worker`` serves ``environments``: named in its capabilities, and its host's builds of them are its."""
    names = [environment.name for environment in environments]
    with transaction.atomic():
        worker = Worker.objects.select_for_update().get(pk=worker.pk)
        worker.capabilities = {**worker.capabilities, "environments": names}
        worker.save(update_fields=["capabilities"])
        EnvironmentBuild.objects.filter(host=socket.gethostname(), environment__in=environments).update(worker=worker)
    return worker


def missing_packages(plugin, environment):
    """The packages a detector's runs import (its zygote's preload: ``Preload.packages``) that ``environment`` does
    not have, in order; [] when it has them all."""
    return [name for name in plugin.preload.packages if canonicalize_name(name) not in environment.resolved]


def facts_in(environment):
    """This host's facts (runners.environments.host.host_facts) as a run in ``environment`` sees them: that
    interpreter's Python and packages (the torch the run imports), and a fingerprint of their own."""
    facts = host_facts()
    if is_default(environment):
        return facts
    packages = {name: environment.resolved[name] for name in RECORDED_PACKAGES if name in environment.resolved}
    fingerprint = hashlib.sha256(f"{facts['fingerprint']}\n{environment.name}".encode()).hexdigest()
    return {**facts, "python": environment.python, "packages": packages, "python_environment": environment.name,
            "fingerprint": fingerprint}
