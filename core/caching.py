"""What can no longer change, computed once: Django's cache (``CACHES`` in benchmark_site/settings.py: Redis with
DJANGO_CACHE_URL, else files under the var directory), which every process of the site shares.

Callers name the value by what makes it immutable (a stored evaluation's content, a campaign's completion time,
docs/performance.md), never by the request alone, so a new evaluation or a reopened campaign is a new key and old
values are never served. Every key also names the code that computed it (``code_version``): after an upgrade the
cache holds nothing the new code would compute differently."""
import hashlib
import os
import random
import threading
from functools import cache as once
from functools import wraps
from pathlib import Path

from django.apps import apps
from django.conf import settings
from django.core.cache import cache
from django.core.cache.backends.base import BaseCache
from django.core.cache.backends.filebased import FileBasedCache
from django.core.exceptions import EmptyResultSet
from django.core.signals import request_finished, request_started
from django.db import connection
from django.db.models import Model, QuerySet
from django.db.models.expressions import RawSQL
from django.template.context import make_context
from django.template.loader import get_template
from django.template.loader_tags import ExtendsNode
from django.utils.safestring import mark_safe

IMMUTABLE_SECONDS = 7 * 24 * 3600  # how long an entry is kept; its key, not its age, is what keeps it right
_MISSING = object()


def digest(value):
    """A short name for ``value`` (by its repr) in a cache key."""
    return hashlib.sha256(repr(value).encode()).hexdigest()[:16]


def loaded_state(value, _within=()):
    """What was read of a model instance (or of a list or queryset of them), to name what is shown of it in a cache
    key: its fields' values as loaded (deferred ones left out) and any attribute set on it, with, nested, those of the
    related objects read with it (select_related, prefetch_related). An object met again inside itself (a prefetched
    child points back to its parent) is named by its primary key."""
    if isinstance(value, (list, tuple, QuerySet)):
        return [loaded_state(item, _within) for item in value]
    if not isinstance(value, Model):
        return value
    if id(value) in _within:
        return value._meta.label, value.pk
    within = (*_within, id(value))
    related = {**value._state.fields_cache, **getattr(value, "_prefetched_objects_cache", {})}
    return [value._meta.label,
            *((name, loaded_state(item, within)) for name, item in vars(value).items() if not name.startswith("_")),
            *((name, loaded_state(related[name], within)) for name in sorted(related))]


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
        _still_changing()
        return compute()
    value = cache.get(_versioned(key), _MISSING)
    if value is _MISSING:
        value = compute()
        cache.set(_versioned(key), value, timeout)
    return value


_computing = threading.local()  # .frames: a list per ``cached_unless_changing`` being computed in this thread


def _still_changing():
    """Tell every ``cached_unless_changing`` being computed that its value used something that may still change."""
    for frame in getattr(_computing, "frames", ()):
        frame["changing"] = True


def cached_unless_changing(key, compute, timeout=IMMUTABLE_SECONDS):
    """As ``cached``, except that a value whose computing used a part that may still change (``cached`` or
    ``cached_many`` with no key, such as the live tables of an open campaign) is not kept: a page built of parts,
    kept only when every part is."""
    if key is None:
        return cached(None, compute)
    value = cache.get(_versioned(key), _MISSING)
    if value is not _MISSING:
        return value
    frames = _computing.__dict__.setdefault("frames", [])
    frame = {"changing": False}
    frames.append(frame)
    try:
        value = compute()
    finally:
        frames.pop()  # this call's own frame, the last: the frames of nested calls are gone already
    if frame["changing"]:
        _still_changing()
    else:
        cache.set(_versioned(key), value, timeout)
    return value


def kept_for_rows(request, part, shown, compute):
    """``compute()`` for ``request``, kept for the same rows of ``shown`` (``rows_state``'s parts: what the page
    shows), query string and reader, unless a part of it may still change (``cached_unless_changing``); computed
    every time where the database cannot tell the rows' state."""
    state = rows_state(*shown)
    key = state and f"{part}:{digest((state, request.GET.urlencode(), reader(request.user)))}"
    return cached_unless_changing(key, compute)


def rendered_blocks(template_name, context, request):
    """{"title": HTML, "content": HTML}: the title and content blocks that ``template_name`` fills in the template it
    extends, each rendered on its own with ``context`` and ``request`` (as ``render`` would, without the page around
    them), for templates/page.html to place: to keep a page's content, then render the page around it at each
    request (the reader's name and messages). A template that fills any other block (the head or the scripts, which
    carry the request's nonce) is refused, rather than shown without it."""
    template = get_template(template_name).template
    blocks = template.nodelist.get_nodes_by_type(ExtendsNode)[0].blocks
    if set(blocks) - {"title", "content"}:
        raise ValueError(f"{template_name} fills blocks other than the title and the content: {sorted(blocks)}")
    context = make_context(context, request)
    with context.bind_template(template):
        return {name: mark_safe(block.nodelist.render(context)) for name, block in blocks.items()}


def reader(user):
    """Whose view a page shows, in a cache key: the public's (anonymous), or one signed-in user's with their
    permissions of now (what they may see and do; the navigation reads them anyway)."""
    if not user.is_authenticated:
        return "public"
    return f"user:{user.pk}:{digest(sorted(user.get_all_permissions()))}"


_shown_on = {}  # a page's name -> what other apps render on it reads: models, or the page's object -> a queryset


def shows_on(page, *parts):
    """Say, from an app whose template tags render part of a lower app's ``page`` (called in its AppConfig.ready),
    which rows that part reads: models (all their rows), or functions of the page's object that return a queryset.
    The lower app keys the page's cache by them (``shown_on``) without naming any model of a higher app."""
    _shown_on.setdefault(page, []).extend(parts)


def shown_on(page, about=None):
    """The parts other apps declared for ``page`` (``shows_on``), as ``rows_state`` takes them; functions are called
    with ``about``, the object the page shows."""
    return tuple(part if isinstance(part, type) else part(about) for part in _shown_on.get(page, ()))


def rows_state(*parts):
    """A digest of the rows of each of ``parts`` (a model's label, "app.Model", or the model, for all its rows, or a
    queryset for those it selects), which any insert, update or delete of one of them changes, by whatever process,
    ``update()`` and raw SQL included; None where the database cannot tell (only PostgreSQL can). PostgreSQL writes
    every change as a new row version, with a place (``ctid``) and the transaction that wrote it (``xmin``) of its
    own, and a reader sees the committed versions only: the digest of their places and writers changes exactly when
    what the reader sees does. One query, which reads every row of ``parts``: for small tables and selections (the
    catalog, the evaluations, one bug's runs).

    What is computed after reading it may see later changes too: it is then newer than its key, never older, and a
    reader who sees those changes gets a new key."""
    if connection.vendor != "postgresql":
        return None
    selects, params = [], []
    for part in parts:
        rows = (apps.get_model(part).objects.all() if isinstance(part, str)
                else part._default_manager.all() if isinstance(part, type) else part)
        table = connection.ops.quote_name(rows.model._meta.db_table)
        versions = rows.order_by().annotate(row_version=RawSQL(f"{table}.ctid::text || {table}.xmin::text", ()))
        try:
            sql, part_params = versions.values("row_version").query.sql_with_params()
        except EmptyResultSet:  # a selection that cannot hold a row (pk__in=[]): its digest is that of no rows
            selects.append("NULL")
            continue
        # in the order the database reads them (sorting them costs more): another order is another key, never a
        # wrong one
        selects.append(f"(SELECT md5(string_agg(row_version, ',')) FROM ({sql}) AS part)")
        params.extend(part_params)
    with connection.cursor() as cursor:
        cursor.execute("SELECT " + ", ".join(selects), params)
        return cursor.fetchone()


def cached_many(keys, compute, timeout=IMMUTABLE_SECONDS):
    """{item: value} for the items of ``keys`` ({item: key, or None for what is still changing}): the cached ones
    in one read, the others from one call of ``compute(items)`` ({item: value}), then kept where they have a key."""
    stored = cache.get_many([_versioned(key) for key in keys.values() if key is not None])
    found = {item: stored[_versioned(key)] for item, key in keys.items()
             if key is not None and _versioned(key) in stored}
    missing = [item for item in keys if item not in found]
    if any(key is None for key in keys.values()):
        _still_changing()
    if missing:
        computed = compute(missing)
        cache.set_many({_versioned(keys[item]): computed[item] for item in missing if keys[item] is not None},
                       timeout)
        found.update(computed)
    return found


_request = threading.local()  # .answers: {(function, arguments): value} while this thread serves a request


def per_request(function):
    """``function``, asked once per request for the same (hashable) arguments: for a read-only question that several
    parts of one page ask, such as which runs the reader may see. Only in requests that change nothing (GET and
    HEAD), where the answer cannot change halfway; in any other request, and outside requests (tasks, commands), it
    is asked every time. A request's thread serves only that request until it has answered."""
    @wraps(function)
    def answered(*arguments):
        answers = getattr(_request, "answers", None)
        if answers is None:
            return function(*arguments)
        key = (function, *arguments)
        if key not in answers:
            answers[key] = function(*arguments)
        return answers[key]
    return answered


def _begin_request(environ=None, **kwargs):
    _request.answers = {} if environ and environ.get("REQUEST_METHOD") in ("GET", "HEAD") else None


def _end_request(**kwargs):
    _request.answers = None


request_started.connect(_begin_request, dispatch_uid="core.caching.per_request")
request_finished.connect(_end_request, dispatch_uid="core.caching.per_request")


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
