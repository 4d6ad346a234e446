"""The web server's settings (docker/gunicorn.conf.py), which the web image, compose and ``manage.py bench_load``
share, and one short pass of bench_load over gunicorn started with them. The figures are bench_load's to print
(docs/performance.md); nothing here times anything."""
import json
import os
import re
import runpy
import subprocess
import sys

import pytest
import yaml
from django.conf import settings
from django.core.management import call_command
from dockerfile_parse import DockerfileParser

from devtools.loadbench import GUNICORN_CONFIG, endpoints

CONFIG = settings.BASE_DIR / GUNICORN_CONFIG


def read_config(monkeypatch, **variables):
    for name in ("WEB_CONCURRENCY", "GUNICORN_THREADS"):
        monkeypatch.delenv(name, raising=False)
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    return runpy.run_path(str(CONFIG))


def test_threaded_workers_one_per_core_unless_told(monkeypatch):
    chosen = read_config(monkeypatch)
    cores = len(os.sched_getaffinity(0))
    assert (chosen["worker_class"], chosen["workers"], chosen["threads"]) == ("gthread", cores, 8)
    told = read_config(monkeypatch, WEB_CONCURRENCY=" 3 ", GUNICORN_THREADS="8")
    assert (told["workers"], told["threads"]) == (3, 8)
    empty = read_config(monkeypatch, WEB_CONCURRENCY="")  # what compose passes when docker/.env leaves it unset
    assert empty["workers"] == cores


@pytest.mark.parametrize("value", ["0", "three", " ", "-1", "2.5"])
def test_a_worker_count_that_is_no_whole_number_stops_gunicorn(monkeypatch, value):
    with pytest.raises(SystemExit, match=f"WEB_CONCURRENCY={value!r} is not a whole number of at least 1"):
        read_config(monkeypatch, WEB_CONCURRENCY=value)


def test_the_web_image_and_compose_start_gunicorn_with_the_config():
    parser = DockerfileParser(str(settings.BASE_DIR / "docker" / "Dockerfile"))
    web = parser.structure[max(i for i, item in enumerate(parser.structure)
                               if item["instruction"] == "FROM" and item["value"].endswith(" AS web")):]
    command = json.loads(next(item["value"] for item in web if item["instruction"] == "CMD"))
    assert command[:4] == ["gunicorn", "benchmark_site.wsgi:application", "--config", GUNICORN_CONFIG]
    compose = yaml.safe_load((settings.BASE_DIR / "docker" / "compose.yaml").read_text())
    assert f"gunicorn benchmark_site.wsgi:application --config {GUNICORN_CONFIG} " in compose["services"]["web"][
        "command"][-1]


def test_gunicorn_checks_the_config():
    checked = subprocess.run([sys.executable, "-m", "gunicorn", "--check-config", "--config", GUNICORN_CONFIG,
                              "benchmark_site.wsgi:application"], cwd=settings.BASE_DIR, capture_output=True,
                             text=True, timeout=120)
    assert checked.returncode == 0, checked.stderr


@pytest.mark.django_db(transaction=True)
def test_bench_load_measures_the_leaderboard_over_gunicorn_as_configured(capsys):
    assert ("leaderboard", "/leaderboard/") in endpoints()
    call_command("bench_load", pages=True, concurrency=2, duration=0.5, only="leaderboard", gunicorn_workers=1)
    out = capsys.readouterr().out
    assert re.search(rf"gunicorn --config {re.escape(GUNICORN_CONFIG)}: gthread, 1 processes x 8 threads", out)
    row = next(line for line in out.splitlines() if line.startswith("| leaderboard |"))
    requests, p50, p95, rps, kib, other = row.strip("| ").split(" | ")[2:]
    assert int(requests) > 0 and other == "-"  # every request answered 200
