"""The test suite's settings (pyproject.toml points pytest here): the real settings, read from the environment
as in production, with the costs that only tests pay taken out. Nothing a test asserts about the site
depends on these three.

Subprocesses the tests start (a Celery worker, ``manage.py quickstart``) inherit DJANGO_SETTINGS_MODULE and
use these settings too, on the same database (runners/worker/local.py passes its URL); the tests that check
production behaviour set ``DJANGO_SETTINGS_MODULE=benchmark_site.settings`` themselves.
"""
from benchmark_site.settings import *  # noqa: F403

# Tests create many users; the default hasher's 1,000,000 PBKDF2 iterations cost ~0.3 s each.
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
# Per process, whatever DJANGO_CACHE_URL says: each test starts with an empty cache (tests/conftest.py).
CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
