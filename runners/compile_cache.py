"""Inductor's compile cache, kept on the worker per reproducer version, so that only a version's first run
compiles from scratch.

A sealed run sees a private ``/tmp``, so ``torch.compile`` would rebuild every graph in every run (about
15 s of PT-197888's 19 s). The worker therefore keeps, per reproducer version (its content hash), the files
that Inductor wrote under ``TORCHINDUCTOR_CACHE_DIR``: each run gets a copy of them in its run directory, and
after a run that ended well, the files it added come back. A version's cache only ever reaches runs of the
same version, whose code could do anything those files do: a hostile reproducer can spoil its own runs,
no one else's. Only regular files come back (the sandbox copies no links out), within a size budget.

Inductor's cache keys name the graph, the inputs' layouts, the config and the torch build, so a hit
loads the same code a fresh compile would make. A reproducer of a bug in the cache itself turns the
cache off for its runs by declaring ``TORCHINDUCTOR_FX_GRAPH_CACHE: "0"`` (and, for AOTAutograd,
``TORCHINDUCTOR_AUTOGRAD_CACHE: "0"``) under ``needs.environment``.
"""
import os
import shutil
import tempfile
from pathlib import Path, PurePosixPath

from django.conf import settings

RUN_CACHE_NAME = ".compile-cache"  # in the run directory
# Set in every run's environment and in the zygotes' (which import Inductor's config, where it is read). With
# precompiled headers on, Inductor preprocesses its C++ prelude and builds a 149 MB header under the default
# ``/tmp`` folder in every process that loads a C++ kernel, even one it finds in the cache: 4 to 5 s of a run of
# PT-197888. The kernels are the same code either way; only how g++ is fed differs.
COMPILER_ENV = {"TORCHINDUCTOR_CPP_CACHE_PRECOMPILE_HEADERS": "0"}
INCOMING_PREFIX = ".incoming-"  # a file being added to a version's cache


def environment(workdir):
    """The variables that point Inductor (and Triton, on GPU nodes) at the run's copy of the cache, and
    ``COMPILER_ENV``."""
    cache = Path(workdir, RUN_CACHE_NAME)
    return {"TORCHINDUCTOR_CACHE_DIR": str(cache / "inductor"), "TRITON_CACHE_DIR": str(cache / "triton"),
            **COMPILER_ENV}


def _version_dir(version):
    return settings.SILENTBENCH_COMPILE_CACHE_DIR / version.content_hash


def _regular_files(root):
    """(relative path, size) of every regular file under ``root``, links and the like left out."""
    for directory, folders, files in os.walk(root):
        folders[:] = [name for name in folders if not os.path.islink(os.path.join(directory, name))]
        for name in files:
            if name.startswith(INCOMING_PREFIX):
                continue
            path = os.path.join(directory, name)
            if os.path.islink(path) or not os.path.isfile(path):
                continue
            yield os.path.relpath(path, root), os.path.getsize(path)


def seed(workdir, version):
    """Copy the version's cache into the run directory; returns how many files it held."""
    source = _version_dir(version)
    target = Path(workdir, RUN_CACHE_NAME)
    target.mkdir()
    if not settings.SILENTBENCH_COMPILE_CACHE_MB or not source.is_dir():
        return 0
    count = 0
    for relative, _ in _regular_files(source):
        destination = target / relative
        destination.parent.mkdir(parents=True, exist_ok=True)
        try:
            shutil.copyfile(source / relative, destination)
        except FileNotFoundError:  # another worker process is replacing it
            continue
        count += 1
    return count


def keep(workdir, version):
    """After a run that ended well: add the files it compiled to the version's cache, up to the budget.
    Files already there are left as they are (their names are their content's keys). Returns how many
    files were added."""
    budget = settings.SILENTBENCH_COMPILE_CACHE_MB * 1024 * 1024
    source = Path(workdir, RUN_CACHE_NAME)
    if not budget or not source.is_dir():
        return 0
    target = _version_dir(version)
    target.mkdir(parents=True, exist_ok=True)
    used = sum(size for _, size in _regular_files(target))
    added = 0
    for relative, size in _regular_files(source):
        parts = PurePosixPath(relative).parts
        if ".." in parts or (target / relative).exists():
            continue
        if used + size > budget:
            break
        destination = target / relative
        destination.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=destination.parent, prefix=INCOMING_PREFIX)
        reader = os.fdopen(os.open(source / relative, os.O_RDONLY | os.O_NOFOLLOW), "rb")
        with os.fdopen(handle, "wb") as writer, reader:
            shutil.copyfileobj(reader, writer)
        os.replace(temporary, destination)  # whole or not at all, for a run copying it at this moment
        used += size
        added += 1
    return added
