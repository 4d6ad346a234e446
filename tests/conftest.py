import os

import pytest
from django.conf import settings
from django.core.cache import cache

pytest_plugins = ["tests.services"]  # own_postgres, own_redis: private servers for the fault tests
# The images' tests build and run containers as root: bin/test-images runs them, bin/test leaves them out.
collect_ignore = [] if os.environ.get("SILENTBENCH_IMAGE_TESTS") == "1" else ["images"]


@pytest.fixture(scope="session", autouse=True)
def static_root():
    """collectstatic makes STATIC_ROOT in production; without it WhiteNoise warns at every start of the site
    (the settings no longer make it on import). Finders serve the files here either way."""
    settings.STATIC_ROOT.mkdir(parents=True, exist_ok=True)


@pytest.fixture(autouse=True)
def fresh_cache():
    """API throttling counts requests in the cache: each test starts with none."""
    cache.clear()
