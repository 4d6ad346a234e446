"""Inductor's compile cache, kept on the worker per reproducer version, so that only a version's first run
compiles from scratch.

A sealed run sees a private ``/tmp``, so ``torch.compile`` would rebuild every graph in every run (about
15 s of PT-197888's 19 s). The worker therefore keeps, per reproducer version (its content hash), the files
that Inductor wrote under ``TORCHINDUCTOR_CACHE_DIR``: each run gets a copy of them in its run directory, and
after a sealed run that ended well (exit code 0, its oracle reported, not killed after it), the files it added
come back. A version's cache only ever reaches runs of a version with the same content, whose code could do
anything those files do: a hostile reproducer can spoil its own runs, no one else's. A run under a submitted
detector only reads the cache and adds nothing (runners.execution): its probe and its ``analyze`` are code that
no reproducer author wrote, running in the same directory, and what they planted would be loaded by the later
runs of every other detector on that version. Only regular files come
back (the sandbox copies no links out, and this module checks again), never what a writer left half done,
within a size budget. Runs not sealed in namespaces keep nothing: a process of theirs may outlive them.

Inductor's cache keys name the graph, the inputs' layouts, the config and the torch build, so a hit
loads the same code a fresh compile would make. A reproducer of a bug in the cache itself compiles from
scratch in every run by declaring its own ``TORCHINDUCTOR_CACHE_DIR`` (for example ``/tmp/inductor``, the
run's private ``/tmp``) under ``needs.environment``.
"""
import os
import shutil
import stat
import tempfile
from pathlib import Path

from django.conf import settings

from .executor import COMPILER_ENV  # set in the zygotes too, which import Inductor's config, where it is read

RUN_CACHE_NAME = ".compile-cache"  # in the run directory
INCOMING_PREFIX = ".incoming-"  # a file being added to a version's cache


def environment(workdir):
    """The variables that point Inductor (and Triton, on GPU nodes) at the run's copy of the cache, and
    ``COMPILER_ENV``."""
    cache = Path(workdir, RUN_CACHE_NAME)
    return {"TORCHINDUCTOR_CACHE_DIR": str(cache / "inductor"), "TRITON_CACHE_DIR": str(cache / "triton"),
            **COMPILER_ENV}


def _version_dir(version):
    """The version's cache, named by its content: versions with the same files and manifest share it."""
    return settings.SILENTBENCH_COMPILE_CACHE_DIR / version.content_hash


def _left_half_done(name):
    """Whether a file or folder name is one that a writer leaves while it works: ours (being added to a
    version's cache) or Inductor's (``write_atomic``'s ``*.tmp`` files, a C++ build's ``*_tmp`` folders)."""
    return name.startswith(INCOMING_PREFIX) or name.endswith((".tmp", "_tmp"))


def _regular_files(root):
    """(relative path, size) of every regular file under ``root``: links, devices, FIFOs and what a writer
    left half done are left out."""
    for directory, folders, files in os.walk(root):
        folders[:] = [name for name in folders
                      if not _left_half_done(name) and not os.path.islink(os.path.join(directory, name))]
        for name in files:
            path = os.path.join(directory, name)
            if _left_half_done(name) or os.path.islink(path) or not os.path.isfile(path):
                continue
            yield os.path.relpath(path, root), os.path.getsize(path)


def seed(workdir, version):
    """Copy the version's cache into the run directory; returns how many files it held. A file that cannot
    be copied is left out: the run compiles it again."""
    source = _version_dir(version)
    target = Path(workdir, RUN_CACHE_NAME)
    target.mkdir()
    if not settings.SILENTBENCH_COMPILE_CACHE_MB or not source.is_dir():
        return 0
    count = 0
    for relative, _ in _regular_files(source):
        destination = target / relative
        try:
            destination.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source / relative, destination)
        except OSError:  # removed meanwhile (an operator clears the cache), or the disk is full
            continue
        count += 1
    return count


def keep(workdir, version):
    """After a sealed run that ended well (all of its processes are gone, none can change the folder now):
    add the files it compiled to the version's cache, up to the budget. Files already there are left as
    they are (their names are their content's keys). Returns (files added, the first error or ''): a file
    that cannot be kept is skipped, and never fails the run."""
    budget = settings.SILENTBENCH_COMPILE_CACHE_MB * 1024 * 1024
    source = Path(workdir, RUN_CACHE_NAME)
    if not budget or not source.is_dir():
        return 0, ""
    target = _version_dir(version)
    added, error = 0, ""
    try:
        target.mkdir(parents=True, exist_ok=True)
        used = sum(size for _, size in _regular_files(target))
        for relative, size in _regular_files(source):
            destination = target / relative
            if os.path.lexists(destination) or used + size > budget:
                continue
            try:
                _add(source / relative, destination, size)
            except OSError as failure:
                error = error or f"{relative}: {failure}"
                continue
            used += size
            added += 1
    except OSError as failure:
        error = error or str(failure)
    return added, error


def _add(source, destination, size):
    """Copy the regular file ``source`` (at most ``size`` bytes) to ``destination``, whole or not at all."""
    destination.parent.mkdir(parents=True, exist_ok=True)
    reader = os.open(source, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        if not stat.S_ISREG(os.fstat(reader).st_mode):
            raise OSError(f"{source} is not a regular file")
        handle, temporary = tempfile.mkstemp(dir=destination.parent, prefix=INCOMING_PREFIX)
        try:
            with os.fdopen(handle, "wb") as writer:
                left = size
                while left and (chunk := os.read(reader, min(left, 1 << 20))):
                    writer.write(chunk)
                    left -= len(chunk)
            os.replace(temporary, destination)  # a run seeded at this moment copies the whole file or none
        except BaseException:
            os.unlink(temporary)
            raise
    finally:
        os.close(reader)
