"""What can no longer change, computed once: Django's cache (``CACHES`` in benchmark_site/settings.py: Redis with
DJANGO_CACHE_URL, else files under the var directory), which every process of the site shares.

Callers name the value by what makes it immutable (a stored evaluation's content, a campaign's completion time,
docs/performance.md), never by the request alone, so a new evaluation or a reopened campaign is a new key and old
values are never served. Every key also names the code that computed it (``code_version``): after an upgrade the
cache holds nothing the new code would compute differently."""
import hashlib
import os
import random
from functools import cache as once
from pathlib import Path

from django.apps import apps
from django.conf import settings
from django.core.cache import cache
from django.core.cache.backends.base import BaseCache
from django.core.cache.backends.filebased import FileBasedCache

IMMUTABLE_SECONDS = 7 * 24 * 3600  # how long an entry is kept; its key, not its age, is what keeps it right
_MISSING = object()


def digest(value):
    """A short name for ``value`` (by its repr) in a cache key."""
    return hashlib.sha256(repr(value).encode()).hexdigest()[:16]


@once
def code_version():
    """A digest of the site's code, templates and pinned dependencies, read once per process."""
    base = Path(settings.BASE_DIR)
    roots = {Path(config.path) for config in apps.get_app_configs() if Path(config.path).is_relative_to(base)}
    files = sorted(path for root in [*roots, base / "templates"] for path in root.rglob("*")
                   if path.suffix in (".py", ".html"))
    hashed = hashlib.sha256((base / "pyproject.toml").read_bytes())
    for path in files:
        hashed.update(str(path.relative_to(base)).encode() + b"\0" + path.read_bytes())
    return hashed.hexdigest()[:12]


def _versioned(key):
    return f"{code_version()}:{key}"


def cached(key, compute, timeout=IMMUTABLE_SECONDS):
    """``compute()``, kept under ``key``; a key of None (what is still changing) computes it every time."""
    if key is None:
        return compute()
    value = cache.get(_versioned(key), _MISSING)
    if value is _MISSING:
        value = compute()
        cache.set(_versioned(key), value, timeout)
    return value


def cached_many(keys, compute, timeout=IMMUTABLE_SECONDS):
    """{item: value} for the items of ``keys`` ({item: key, or None for what is still changing}): the cached ones
    in one read, the others from one call of ``compute(items)`` ({item: value}), then kept where they have a key."""
    stored = cache.get_many([_versioned(key) for key in keys.values() if key is not None])
    found = {item: stored[_versioned(key)] for item, key in keys.items()
             if key is not None and _versioned(key) in stored}
    missing = [item for item in keys if item not in found]
    if missing:
        computed = compute(missing)
        cache.set_many({_versioned(keys[item]): computed[item] for item in missing if keys[item] is not None},
                       timeout)
        found.update(computed)
    return found


class FileCache(FileBasedCache):
    """Django's file cache, with two changes. Its folder is made by its first write (``set`` makes it), not as it
    is opened: the settings' checks open every cache, and reading the settings makes no folder
    (benchmark_site/settings.py). And one write in CULL_EVERY, at random, lists the folder to see whether it holds
    more than MAX_ENTRIES files and drops some, rather than every write: the API's throttle writes at each
    request, and listing a folder of a thousand files costs more than the request."""

    CULL_EVERY = 50

    def __init__(self, dir, params):
        BaseCache.__init__(self, params)
        self._dir = os.path.abspath(dir)

    def _cull(self):
        if random.randrange(self.CULL_EVERY) == 0:
            super()._cull()
