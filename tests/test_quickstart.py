"""The README's main command, on the embedded default (SQLite, filesystem broker, local worker)."""
import os
import subprocess
import sys

import pytest
from django.conf import settings

from runners.worker.local import worker_command

pytestmark = pytest.mark.integration


def test_quickstart_runs_a_campaign_end_to_end_without_servers(tmp_path):
    env = {key: value for key, value in os.environ.items() if key not in ("DATABASE_URL", "CELERY_BROKER_URL")}
    env["SILENTBENCH_VAR_DIR"] = str(tmp_path)
    result = subprocess.run(
        [sys.executable, "manage.py", "quickstart", "--no-serve", "--bugs", "PT-FORUM-84911",
         "--detectors", "plain,nan_inf,param_not_updated"],
        cwd=settings.BASE_DIR, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    assert (tmp_path / "silentbench.sqlite3").exists()
    # the published evaluation that ships is there before the campaign (the front door shows it from the start)
    loaded = result.stdout.index("Published evaluation ")
    assert ": loaded (evaluation #1" in result.stdout[loaded:] and loaded < result.stdout.index("Campaign #")
    assert "6/6 runs" in result.stdout  # 1 reproducer x 2 variants x 3 detectors, with a progress bar
    matrix = result.stdout.split("Detection matrix", 1)[1]
    row = next(line for line in matrix.splitlines() if line.startswith("PT-FORUM-84911"))
    assert "detected 1/1" in row and "FA" not in row  # param_not_updated, and no false alarm anywhere
    assert row.count("missed 0/1") == 2  # nan_inf and plain


def test_only_a_worker_that_asks_holds_a_run_ahead_per_slot():
    """The quickstart's worker, alone on its broker, holds its next run per slot (--prefetch-multiplier 2); every
    other local worker keeps the settings' one, so that a queued run waits for whichever worker is free."""
    command = worker_command(concurrency=2, prefetch_multiplier=2)
    assert command[command.index("--prefetch-multiplier") + 1] == "2"
    assert "--prefetch-multiplier" not in worker_command(concurrency=2)
