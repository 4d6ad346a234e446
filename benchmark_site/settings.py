"""Settings come from the environment; the defaults give a local, serverless setup.

Embedded default: SQLite in ``var/`` and Celery's filesystem broker (no Redis).
Production: set ``DATABASE_URL`` (PostgreSQL) and ``CELERY_BROKER_URL`` (Redis).

A value that cannot be read (a typo in a boolean, a number out of range) stops the process at start with
``ImproperlyConfigured`` naming the variable, never a silent default. Reading the settings touches no file:
the folders under ``VAR_DIR`` are made where they are first used (the database's folder as SQLite opens it,
the broker's as the Celery app is configured, run, lock and log folders by whatever writes into them).
"""
import math
import os
import re
import sqlite3
import warnings
from datetime import timedelta
from pathlib import Path

import dj_database_url
from csp.constants import NONCE, NONE, SELF
from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(os.environ.get("SILENTBENCH_VAR_DIR", BASE_DIR / "var"))

_TRUE_WORDS = ("true", "1", "yes", "on")
_FALSE_WORDS = ("false", "0", "no", "off")


def env_bool(name, default=False):
    """true/false, 1/0, yes/no or on/off, in any case; unset gives ``default``, anything else is refused."""
    raw = os.environ.get(name)
    if raw is None:
        return default
    word = raw.strip().lower()
    if word in _TRUE_WORDS or word in _FALSE_WORDS:
        return word in _TRUE_WORDS
    raise ImproperlyConfigured(f"{name}={raw!r} is not a boolean: use one of "
                               f"{', '.join(f'{yes}/{no}' for yes, no in zip(_TRUE_WORDS, _FALSE_WORDS))}.")


def _allowed_range(minimum, maximum):
    if minimum is not None and maximum is not None:
        return f"from {minimum} to {maximum}"
    if minimum is not None:
        return f"at least {minimum}"
    return f"at most {maximum}" if maximum is not None else "any value"


def _env_number(name, default, kind, minimum, maximum):
    raw = os.environ.get(name)
    if raw is None:
        return default
    what = "a whole number" if kind is int else "a number"
    allowed = f"{what}, {_allowed_range(minimum, maximum)}"
    try:
        value = kind(raw.strip())
    except ValueError:
        raise ImproperlyConfigured(f"{name}={raw!r} is not {what}: expected {allowed}.") from None
    if not _within(value, minimum, maximum) or (kind is float and not math.isfinite(value)):
        raise ImproperlyConfigured(f"{name}={raw!r} is out of range: expected {allowed}.")
    return value


def _within(value, minimum, maximum):
    return (minimum is None or value >= minimum) and (maximum is None or value <= maximum)


def env_int(name, default, minimum=None, maximum=None):
    """An integer variable within [minimum, maximum]; unset gives ``default``, anything else is refused."""
    return _env_number(name, default, int, minimum, maximum)


def env_float(name, default, minimum=None, maximum=None):
    """A finite number within [minimum, maximum]; unset gives ``default``, anything else is refused."""
    return _env_number(name, default, float, minimum, maximum)


def env_list(name, default):
    """Comma-separated items, blanks dropped."""
    return [item.strip() for item in os.environ.get(name, default).split(",") if item.strip()]


RATE_PATTERN = r"\d+/[smhd]\w*"  # DRF reads the period's first letter: 300/min, 10/minutes, 5/hour, 1000/day


def env_rate(name, default):
    """A request rate as DRF reads it ("300/min"), checked at start rather than at the first request."""
    raw = os.environ.get(name, default).strip()
    if not re.fullmatch(RATE_PATTERN, raw):
        raise ImproperlyConfigured(f"{name}={raw!r} is not a rate: use requests/period, e.g. 300/min "
                                   "(period: s, min, hour or day).")
    return raw


LOG_LEVELS = ("NOTSET", "DEBUG", "INFO", "WARNING", "WARN", "ERROR", "CRITICAL")


def env_choice(name, default, choices):
    """One of ``choices``, in any case (given back in upper case)."""
    raw = os.environ.get(name, default)
    if raw.strip().upper() not in choices:
        raise ImproperlyConfigured(f"{name}={raw!r}: use one of {', '.join(choices)}.")
    return raw.strip().upper()


def require(condition, message):
    """A rule between settings (one must exceed another): refused at start, naming the variables."""
    if not condition:
        raise ImproperlyConfigured(message)


def env_int_list(name, default, minimum=None, maximum=None):
    """Comma-separated integers, each within [minimum, maximum]; one bad item refuses the whole variable."""
    values = []
    for item in env_list(name, default):
        try:
            value = int(item)
        except ValueError:
            value = None
        if value is None or not _within(value, minimum, maximum):
            raise ImproperlyConfigured(f"{name}={os.environ.get(name, default)!r}: expected comma-separated whole "
                                       f"numbers, each {_allowed_range(minimum, maximum)}; {item!r} is not.")
        values.append(value)
    return values


def env_path(name, default):
    """An absolute folder (``~`` expanded); unset gives ``default``, a relative or empty path is refused."""
    raw = os.environ.get(name)
    if raw is None:
        return Path(default)
    path = Path(raw.strip()).expanduser()
    if not raw.strip() or not path.is_absolute():
        raise ImproperlyConfigured(f"{name}={raw!r} is not an absolute path.")
    return path


def env_requirement_sets(name, default):
    """Sets of pip requirements: sets separated by ";", requirements of a set by ","; each set must pin torch
    (an environment's interpreter runs reproducers). One bad requirement refuses the whole variable."""
    from packaging.requirements import InvalidRequirement, Requirement

    raw = os.environ.get(name, default)
    sets = []
    for part in raw.split(";"):
        items = [item.strip() for item in part.split(",") if item.strip()]
        if not items:
            continue
        try:
            requirements = [str(Requirement(item)) for item in items]
        except InvalidRequirement as error:
            raise ImproperlyConfigured(f"{name}={raw!r}: {error}.") from None
        if not any(Requirement(item).name.lower() == "torch" for item in requirements):
            raise ImproperlyConfigured(f"{name}={raw!r}: the set {part.strip()!r} pins no torch (e.g. torch==2.11.0).")
        sets.append(requirements)
    return sets


class SQLiteConnection(sqlite3.Connection):
    """SQLite's connection, which first makes the database file's folder: a fresh ``var/`` is created on
    first use (``migrate``, a worker, the test database), not when the settings are read."""

    def __init__(self, database, *args, **kwargs):
        name = os.fspath(database)
        if isinstance(name, str) and name != ":memory:" and not name.startswith("file:"):
            Path(name).parent.mkdir(parents=True, exist_ok=True)
        super().__init__(database, *args, **kwargs)


DEBUG = env_bool("DJANGO_DEBUG", False)
# Production (docs/security.md): DJANGO_ENV=production, or a DJANGO_SECRET_KEY given (unless DJANGO_ENV=local
# or DJANGO_DEBUG). The fixed key below is only acceptable for a local, loopback-only setup.
LOCAL_SECRET_KEY = "silentbench-local-development-key-not-for-production"
SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", LOCAL_SECRET_KEY)
DJANGO_ENV = os.environ.get("DJANGO_ENV", "").strip().lower()
if DJANGO_ENV not in {"", "local", "production"}:
    raise ImproperlyConfigured(f"DJANGO_ENV is {DJANGO_ENV!r}: use 'production' or 'local'.")
PRODUCTION = DJANGO_ENV == "production" or (not DJANGO_ENV and not DEBUG and "DJANGO_SECRET_KEY" in os.environ)
if PRODUCTION and SECRET_KEY in {"", LOCAL_SECRET_KEY}:
    raise ImproperlyConfigured("DJANGO_ENV=production needs its own DJANGO_SECRET_KEY (e.g. `openssl rand -hex 32`); "
                               "the built-in key is public. For a local setup, set DJANGO_ENV=local.")
ALLOWED_HOSTS = env_list("DJANGO_ALLOWED_HOSTS", "localhost,127.0.0.1,[::1],testserver")
CSRF_TRUSTED_ORIGINS = env_list("DJANGO_CSRF_TRUSTED_ORIGINS", "")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "whitenoise.runserver_nostatic",
    "django.contrib.staticfiles",
    "rest_framework",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "axes",
    "csp",
    "core",
    "bugs",
    "runners",
    "evaluation",
    "sensitivity",
    "accounts",
]
if not PRODUCTION:  # benchmarks, synthetic history, screenshots: development and tests only
    INSTALLED_APPS.append("devtools")

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "benchmark_site.security.RequestSizeLimitMiddleware",  # before anything reads the body
    "benchmark_site.middleware.NulCharacterMiddleware",  # a NUL in the URL, query, cookies or form is a 400
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "csp.middleware.CSPMiddleware",
    "benchmark_site.middleware.DatabaseUnavailableMiddleware",  # a database outage is a 503, not a 500
    "axes.middleware.AxesMiddleware",  # last, as django-axes asks: a locked-out sign-in becomes its 429
]

ROOT_URLCONF = "benchmark_site.urls"
WSGI_APPLICATION = "benchmark_site.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

DATABASES = {
    "default": dj_database_url.config(
        default=f"sqlite:///{VAR_DIR / 'silentbench.sqlite3'}", conn_max_age=60, conn_health_checks=True
    )
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # The web server and the local worker write concurrently: WAL plus immediate transactions.
    DATABASES["default"]["OPTIONS"] = {
        "timeout": 30,
        "transaction_mode": "IMMEDIATE",
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        "factory": SQLiteConnection,  # makes the database's folder as it connects
    }
    DATABASES["default"]["CONN_MAX_AGE"] = 0
    # A file, not memory, so that a worker process sees the test database too.
    DATABASES["default"]["TEST"] = {"NAME": str(VAR_DIR / "test.sqlite3")}

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    # Not a rule: Django tells validators of every password change, and this one revokes the account's API tokens.
    {"NAME": "accounts.passwords.RevokeApiTokensOnPasswordChange"},
]
# django-axes first: a locked-out account or client is refused before any password is checked.
AUTHENTICATION_BACKENDS = ["axes.backends.AxesStandaloneBackend", "django.contrib.auth.backends.ModelBackend"]
LOGIN_URL = "/accounts/login/"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "/static/"
STATIC_ROOT = VAR_DIR / "staticfiles"  # collectstatic target (which makes it) in production; finders serve locally
# Locally the finders serve the static files and STATIC_ROOT exists only after collectstatic: WhiteNoise's
# warning about the missing folder says nothing then.
warnings.filterwarnings("ignore", message=r"No directory at: .*staticfiles")
STATICFILES_DIRS = [BASE_DIR / "static", ("docs-img", BASE_DIR / "docs" / "img")]  # the docs' images: /docs/ pages
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
}
# Locally the finders serve the files as they are. In production collectstatic has run (the web image runs it) and
# WhiteNoise serves what it wrote, with the compressed copies: finders there would shadow them with the plain sources
# (the web container served every stylesheet and script uncompressed).
WHITENOISE_USE_FINDERS = not PRODUCTION
# Files served at the site's root: /favicon.ico, which browsers ask for on pages that name no icon (JSON, the admin).
WHITENOISE_ROOT = BASE_DIR / "static" / "root"

# --- Security (docs/security.md). In production the site is HTTPS only: TLS ends at a proxy in front of
# gunicorn that sets X-Forwarded-Proto. DJANGO_HTTPS=false turns that off (plain HTTP; `check --deploy` says so).
HTTPS = env_bool("DJANGO_HTTPS", PRODUCTION)
SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = HTTPS
SESSION_COOKIE_HTTPONLY = True
X_FRAME_OPTIONS = "DENY"
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
SECURE_SSL_REDIRECT = HTTPS
SECURE_REDIRECT_EXEMPT = [r"^healthz"]  # health checks come over plain HTTP from inside the host
BEHIND_PROXY = HTTPS and env_bool("DJANGO_TRUST_X_FORWARDED_PROTO", True)
if BEHIND_PROXY:
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
SECURE_HSTS_SECONDS = env_int("DJANGO_HSTS_SECONDS", 365 * 24 * 3600, minimum=0) if HTTPS else 0
# Opt-ins: they bind every subdomain of the lab's domain (and browsers' preload lists) to HTTPS.
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("DJANGO_HSTS_INCLUDE_SUBDOMAINS", False)
SECURE_HSTS_PRELOAD = env_bool("DJANGO_HSTS_PRELOAD", False)
# Reverse proxies in front of gunicorn that each append the address they saw to X-Forwarded-For: the client's
# address is the one the outermost of them saw (benchmark_site.security.client_ip). With 0 (no proxy) the header
# is ignored, since anyone can send it. Default: 1 where X-Forwarded-Proto is trusted, since a proxy sets it;
# 0 there makes every client the proxy (`check --deploy` warns: accounts/checks.py).
SILENTBENCH_NUM_PROXIES = env_int("SILENTBENCH_NUM_PROXIES", 1 if BEHIND_PROXY else 0, minimum=0, maximum=10)
# --- Sign-in attempts (django-axes, docs/accounts.md): the web login, POST /api/token/ and the admin's login.
# Failures are counted per account and per client address in the database, which every process and web node
# shares; either count reaching the limit refuses sign-ins, the right password too, with a 429 until the
# cool-off (at most a week) has passed since the failure that locked it.
AXES_HANDLER = "axes.handlers.database.AxesDatabaseHandler"
AXES_FAILURE_LIMIT = env_int("SILENTBENCH_LOGIN_FAILURE_LIMIT", 10, minimum=1)
AXES_COOLOFF_TIME = timedelta(minutes=env_float("SILENTBENCH_LOGIN_COOLOFF_MINUTES", 15.0, minimum=1,
                                                maximum=7 * 24 * 60))
# Attempts refused during a lock-out are not counted: counted (axes' default), each restarted the cool-off, so
# one attempt per cool-off, the owner's own included, kept an account locked for ever.
AXES_RESET_COOL_OFF_ON_FAILURE_DURING_LOCKOUT = False
AXES_LOCKOUT_PARAMETERS = ["username", "ip_address"]
AXES_CLIENT_IP_CALLABLE = "benchmark_site.security.client_ip"
AXES_USERNAME_CALLABLE = "benchmark_site.security.attempted_username"
AXES_LOCKOUT_CALLABLE = "accounts.views.locked_out"
AXES_VERBOSE = False  # no banner at every start; each failure and lock-out is still logged
# Never: signing in to one's own account would clear the failures counted against another from the same address.
AXES_RESET_ON_SUCCESS = False
# --- Content-Security-Policy (django-csp): scripts, styles, images and requests from this site only; inline
# style sheets (highlighted code, plotly's rules: templates/core/plots.html) carry the request's nonce. The one
# style attribute allowed is an empty one, which plotly's colour bars set (the hash of "").
CONTENT_SECURITY_POLICY = {"DIRECTIVES": {
    "default-src": [SELF], "script-src": [SELF], "style-src": [SELF, NONCE],
    "style-src-attr": ["'unsafe-hashes'", "'sha256-47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU='"],
    "img-src": [SELF, "data:"], "object-src": [NONE], "base-uri": [NONE], "form-action": [SELF],
    "frame-ancestors": [NONE],
}}
# --- Django's cache, shared by every process of the site: what a stored evaluation or a completed campaign makes
# immutable (core/caching.py: tables, plots, pages' parts, exports) and the API throttles' counts. DJANGO_CACHE_URL
# names a Redis (compose sets it), which the web nodes share. Without it, files under VAR_DIR/cache: the gunicorn
# workers of one host share them with no server to run, and unlike the database cache they need no table
# (`createcachetable`) and never wait for SQLite's single writer, which the worker holds as it stores results.
CACHE_URL = os.environ.get("DJANGO_CACHE_URL", "").strip()
if CACHE_URL:
    if not re.fullmatch(r"(rediss?|unix)://\S+", CACHE_URL):
        raise ImproperlyConfigured(f"DJANGO_CACHE_URL={CACHE_URL!r} is not a Redis URL: use redis://[:password@]host"
                                   ":port/db, rediss://... or unix:///path/to/redis.sock.")
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": CACHE_URL}}
else:
    CACHES = {"default": {"BACKEND": "core.caching.FileCache",
                          "LOCATION": VAR_DIR / "cache", "OPTIONS": {"MAX_ENTRIES": 2000}}}

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "accounts.authentication.ApiTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticatedOrReadOnly"],
    "DEFAULT_FILTER_BACKENDS": ["django_filters.rest_framework.DjangoFilterBackend"],
    "DEFAULT_PAGINATION_CLASS": "rest_framework.pagination.PageNumberPagination",
    "PAGE_SIZE": 50,
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    # JSON nested at most core.untrusted.MAX_DEPTH levels, with nothing a database refuses (NUL, NaN)
    "DEFAULT_PARSER_CLASSES": ["core.untrusted.BoundedJSONParser", "rest_framework.parsers.FormParser",
                               "rest_framework.parsers.MultiPartParser"],
    # Anonymous callers by address (benchmark_site.security.client_ip, as for sign-in attempts), signed-in ones
    # by account: two scopes, never the same bucket; and a view's throttle_scope ("token") by address too.
    "DEFAULT_THROTTLE_CLASSES": ["benchmark_site.security.AnonRateThrottle",
                                 "benchmark_site.security.UserRateThrottle",
                                 "benchmark_site.security.ScopedRateThrottle"],
    "DEFAULT_THROTTLE_RATES": {
        "anon": env_rate("SILENTBENCH_ANON_RATE", "300/min"),  # per client address
        "user": env_rate("SILENTBENCH_USER_RATE", "1200/min"),  # per signed-in user or token
        "token": env_rate("SILENTBENCH_TOKEN_RATE", "10/min"),  # password checks at /api/token/
    },
}
SPECTACULAR_SETTINGS = {
    "TITLE": "SilentBench API",
    "DESCRIPTION": "Catalog of silent training errors, their reproducers, detector runs and evaluation tables.",
    "VERSION": "0.1.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    # Enums that several serializers share get one name each in the schema.
    "ENUM_NAME_OVERRIDES": {"VariantEnum": "core.enums.Variant", "FailureKindEnum": "runners.models.RunFailureKind"},
}

# --- Celery: the broker is transport, never truth. ---
BROKER_DIR = VAR_DIR / "broker"  # its folders are made as the Celery app is configured (benchmark_site/celery.py)
CELERY_BROKER_URL = os.environ.get("CELERY_BROKER_URL", "filesystem://")
if CELERY_BROKER_URL.startswith("filesystem://"):
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "control_folder": str(BROKER_DIR / "control"),  # kombu's default is ./control, in the checkout
        "data_folder_in": str(BROKER_DIR / "queue"),
        "data_folder_out": str(BROKER_DIR / "queue"),
        "processed_folder": str(BROKER_DIR / "processed"),
        "store_processed": False,
        # kombu reads the queue folder once a second by default: with warm runs under a second, that was the
        # slowest step of a local campaign (docs/performance.md); every 0.02 s would take 1.4 % of a core while the
        # worker is idle, against 0.3 % (the quickstart's worker holds a run ahead instead)
        "polling_interval": 0.1,
    }
else:
    CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": 3600}
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_DEFAULT_QUEUE = "cpu"
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
# Fault tolerance (runners/reconciler.py): a worker's heartbeat, after how long a silent worker's runs
# are queued again, after how long a queued run with no message in the broker is enqueued again,
# and how long a worker keeps trying to store a result while the database is away.
SILENTBENCH_HEARTBEAT_SECONDS = env_float("SILENTBENCH_HEARTBEAT_SECONDS", 15.0, minimum=0.1)
SILENTBENCH_WORKER_STALE_SECONDS = env_float("SILENTBENCH_WORKER_STALE_SECONDS", 90.0, minimum=1)
require(SILENTBENCH_WORKER_STALE_SECONDS > 2 * SILENTBENCH_HEARTBEAT_SECONDS,
        f"SILENTBENCH_WORKER_STALE_SECONDS ({SILENTBENCH_WORKER_STALE_SECONDS:g}) must exceed twice "
        f"SILENTBENCH_HEARTBEAT_SECONDS ({SILENTBENCH_HEARTBEAT_SECONDS:g}), or live workers' runs are requeued.")
SILENTBENCH_REQUEUE_QUEUED_AFTER_SECONDS = env_float("SILENTBENCH_REQUEUE_QUEUED_AFTER_SECONDS", 60.0, minimum=1)
SILENTBENCH_DB_RETRY_SECONDS = env_float("SILENTBENCH_DB_RETRY_SECONDS", 120.0, minimum=0)

# --- Run sandbox limits (a reproducer may ask for less, never for more). ---
SILENTBENCH_RUN_DIR = VAR_DIR / "runs"  # made by the run and fit code (runners/execution.py, .../fitting.py)
SILENTBENCH_MAX_TIME_LIMIT = env_int("SILENTBENCH_MAX_TIME_LIMIT", 600, minimum=1)
SILENTBENCH_MAX_MEMORY_MB = env_int("SILENTBENCH_MAX_MEMORY_MB", 8192, minimum=1)
SILENTBENCH_LOG_CAP_BYTES = env_int("SILENTBENCH_LOG_CAP_BYTES", 64 * 1024, minimum=0)
SILENTBENCH_OUTPUT_FLOOD_BYTES = env_int("SILENTBENCH_OUTPUT_FLOOD_BYTES", 32 * 1024 * 1024, minimum=1)
SILENTBENCH_REPORT_CAP_BYTES = env_int("SILENTBENCH_REPORT_CAP_BYTES", 16 * 1024 * 1024, minimum=1)
SILENTBENCH_MAX_PROCESSES = env_int("SILENTBENCH_MAX_PROCESSES", 512, minimum=1)
# Open files per process of a run (RLIMIT_NOFILE): what a run gets, and the most a reproducer may declare
# (needs.open_files); never above the worker's own hard limit.
SILENTBENCH_OPEN_FILES = env_int("SILENTBENCH_OPEN_FILES", 4096, minimum=64)
# A worker that would take GPU runs first probes each GPU as a sealed run (cuInit, a matrix product, free memory) and
# offers only those that pass (runners/environments/gpu_check.py).
SILENTBENCH_GPU_SELF_CHECK = env_bool("SILENTBENCH_GPU_SELF_CHECK", True)
# Threads of a run (OpenMP, MKL, OpenBLAS and torch's intra-op pool): 0 gives each run its share of the worker's
# cores, max(1, cores // concurrency); a reproducer may declare more (needs.threads), up to the cores.
SILENTBENCH_RUN_THREADS = env_int("SILENTBENCH_RUN_THREADS", 0, minimum=0)
# A cgroup per run where the worker may make one (runners/executor/cgroups.py): the kernel's account of its memory,
# processes and CPU share. false leaves runs in the worker's cgroup, watched process by process.
SILENTBENCH_RUN_CGROUPS = env_bool("SILENTBENCH_RUN_CGROUPS", True)
SILENTBENCH_MAX_OPEN_FILES = env_int("SILENTBENCH_MAX_OPEN_FILES", 65536, minimum=64)
require(SILENTBENCH_OPEN_FILES <= SILENTBENCH_MAX_OPEN_FILES,
        f"SILENTBENCH_OPEN_FILES ({SILENTBENCH_OPEN_FILES}) must be at most SILENTBENCH_MAX_OPEN_FILES "
        f"({SILENTBENCH_MAX_OPEN_FILES}).")
# A run's run directory, /tmp and /dev/shm together (one tmpfs: runners/executor/isolation.py), in MB.
SILENTBENCH_MAX_DISK_MB = env_int("SILENTBENCH_MAX_DISK_MB", 1024, minimum=1)
# Where the kernel or container offers no user namespaces, run untrusted code anyway (docs/security.md).
SILENTBENCH_ALLOW_UNISOLATED = env_bool("SILENTBENCH_ALLOW_UNISOLATED", False)
# Inductor's compile cache per reproducer version (runners/compile_cache.py): its folder and its size
# budget per version in MB; 0 turns it off (every run compiles from scratch).
SILENTBENCH_COMPILE_CACHE_DIR = VAR_DIR / "compile-cache"
SILENTBENCH_COMPILE_CACHE_MB = env_int("SILENTBENCH_COMPILE_CACHE_MB", 256, minimum=0)
require(SILENTBENCH_COMPILE_CACHE_MB < SILENTBENCH_MAX_DISK_MB,
        f"SILENTBENCH_COMPILE_CACHE_MB ({SILENTBENCH_COMPILE_CACHE_MB}) must be less than SILENTBENCH_MAX_DISK_MB "
        f"({SILENTBENCH_MAX_DISK_MB}): each run holds a copy of its version's cache in its disk total.")
# Fork runs from a zygote that has imported torch (runners/executor/zygote.py); false starts every run cold.
SILENTBENCH_WARM_START = env_bool("SILENTBENCH_WARM_START", True)
# After its oracle record, how long a run's processes may take to end before they are killed.
SILENTBENCH_TEARDOWN_GRACE_SECONDS = env_float("SILENTBENCH_TEARDOWN_GRACE_SECONDS", 10.0, minimum=0)
# A worker running as root starts reproducers as this user ("" keeps root); see runners/executor/.
SILENTBENCH_SANDBOX_USER = os.environ.get("SILENTBENCH_SANDBOX_USER", "nobody")
# --- Routing by need (runners/environments/routing.py, docs/gpu-nodes.md). ---
SILENTBENCH_GPU_MEMORY_TIERS_GB = env_int_list("SILENTBENCH_GPU_MEMORY_TIERS_GB", "16,24,40,48,80", minimum=1)
SILENTBENCH_GPU_LOCK_DIR = Path(os.environ.get("SILENTBENCH_GPU_LOCK_DIR", VAR_DIR / "gpu-locks"))  # device leases
SILENTBENCH_GPU_LEASE_WAIT_SECONDS = env_float("SILENTBENCH_GPU_LEASE_WAIT_SECONDS", 1800.0, minimum=0)
# How many runs may hold one GPU at once: 1, each run has its GPUs to itself; k > 1, each GPU has k lease slots and a
# run counts on 1/k of a GPU's memory where routing and the lease judge gpu_memory_gb (docs/gpu-nodes.md).
SILENTBENCH_RUNS_PER_GPU = env_int("SILENTBENCH_RUNS_PER_GPU", 1, minimum=1, maximum=64)
SILENTBENCH_UNSERVABLE_GRACE_MINUTES = env_float("SILENTBENCH_UNSERVABLE_GRACE_MINUTES", 10.0, minimum=0)
SILENTBENCH_WORKER_SEEN_MINUTES = env_float("SILENTBENCH_WORKER_SEEN_MINUTES", 10.0, minimum=0)
require(SILENTBENCH_WORKER_SEEN_MINUTES * 60 > SILENTBENCH_HEARTBEAT_SECONDS,
        f"SILENTBENCH_WORKER_SEEN_MINUTES ({SILENTBENCH_WORKER_SEEN_MINUTES:g}) must be longer than "
        f"SILENTBENCH_HEARTBEAT_SECONDS ({SILENTBENCH_HEARTBEAT_SECONDS:g} s), or no worker ever counts as live.")
# --- Python environments of other torch releases (runners/environments/, docs/environments.md). ---
# One built environment per folder, made by the build; on the same file system as the uv cache (hard links).
SILENTBENCH_ENVIRONMENTS_DIR = env_path("SILENTBENCH_ENVIRONMENTS_DIR", VAR_DIR / "environments")
SILENTBENCH_UV_CACHE_DIR = env_path("SILENTBENCH_UV_CACHE_DIR", Path.home() / ".cache" / "uv")
# The environments a worker builds as it starts and then serves: requirement sets separated by ";", the
# requirements of one set by ",": "torch==2.11.0;torch==2.15.0,numpy==2.4.6". Empty: the default one only.
SILENTBENCH_WORKER_ENVIRONMENTS = env_requirement_sets("SILENTBENCH_WORKER_ENVIRONMENTS", "")
# Submitted reproducers: limits checked before anything is stored; k seeds of verification on approval.
SILENTBENCH_SUBMISSION_MAX_FILES = env_int("SILENTBENCH_SUBMISSION_MAX_FILES", 20, minimum=1)
SILENTBENCH_SUBMISSION_MAX_FILE_BYTES = env_int("SILENTBENCH_SUBMISSION_MAX_FILE_BYTES", 256 * 1024, minimum=1)
SILENTBENCH_SUBMISSION_MAX_TOTAL_BYTES = env_int("SILENTBENCH_SUBMISSION_MAX_TOTAL_BYTES", 1024 * 1024, minimum=1)
# Any request body: a submission's files plus room for its form; larger ones get a 413 before a byte is read.
SILENTBENCH_MAX_REQUEST_BYTES = env_int("SILENTBENCH_MAX_REQUEST_BYTES",
                                        SILENTBENCH_SUBMISSION_MAX_TOTAL_BYTES + 1024 * 1024, minimum=1)
DATA_UPLOAD_MAX_MEMORY_SIZE = SILENTBENCH_MAX_REQUEST_BYTES  # the body without its files
FILE_UPLOAD_MAX_MEMORY_SIZE = SILENTBENCH_MAX_REQUEST_BYTES  # uploads stay in memory: nothing on disk
require(SILENTBENCH_MAX_REQUEST_BYTES > SILENTBENCH_SUBMISSION_MAX_TOTAL_BYTES,
        f"SILENTBENCH_MAX_REQUEST_BYTES ({SILENTBENCH_MAX_REQUEST_BYTES}) must exceed "
        f"SILENTBENCH_SUBMISSION_MAX_TOTAL_BYTES ({SILENTBENCH_SUBMISSION_MAX_TOTAL_BYTES}): a submission's body "
        "holds its files and its form.")
# At most runners.plans.MAX_SEEDS: more would make every approval fail.
SILENTBENCH_VERIFICATION_SEEDS = env_int("SILENTBENCH_VERIFICATION_SEEDS", 3, minimum=1, maximum=100)
SILENTBENCH_CATALOG_DIR = Path(os.environ.get("SILENTBENCH_CATALOG_DIR", BASE_DIR / "catalog"))
# A reproducer.yaml (submitted or in the catalog) is parsed only if it is at most this long (core/untrusted.py).
SILENTBENCH_MAX_MANIFEST_BYTES = env_int("SILENTBENCH_MAX_MANIFEST_BYTES", 16 * 1024, minimum=1)

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": env_choice("DJANGO_LOG_LEVEL", "INFO", LOG_LEVELS)},
}
