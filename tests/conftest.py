import pytest
from django.core.cache import cache

pytest_plugins = ["tests.services"]  # own_postgres, own_redis: private servers for the fault tests


@pytest.fixture(autouse=True)
def fresh_cache():
    """API throttling counts requests in the cache: each test starts with none."""
    cache.clear()
