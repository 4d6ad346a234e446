import pytest
from django.core.cache import cache


@pytest.fixture(autouse=True)
def fresh_cache():
    """API throttling counts requests in the cache: each test starts with none."""
    cache.clear()
