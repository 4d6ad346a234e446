"""The documentation's template is a working reproducer, run through the real runner."""
import re

import pytest
from django.conf import settings

from runners.execution import execute

from .factories import ReproducerVersionFactory, RunFactory

pytestmark = [pytest.mark.django_db, pytest.mark.integration]


@pytest.mark.parametrize("variant, manifested", [("buggy", True), ("fixed", False)])
def test_template_in_writing_a_reproducer_works(variant, manifested):
    text = (settings.BASE_DIR / "docs" / "writing-a-reproducer.md").read_text()
    template = re.search(r"```python\n(.*?)```", text, re.S).group(1)
    version = ReproducerVersionFactory(files={"repro.py": template}, time_limit_seconds=60, memory_mb=4096)
    outcome = execute(RunFactory(reproducer_version=version, variant=variant, steps=20))
    assert outcome.succeeded, outcome.failure_reason
    assert outcome.oracle["manifested"] is manifested
    assert len(outcome.steps) == 20
