"""Settings read from the environment: a value that cannot be read stops the process at start, naming the
variable; reading the settings makes no directory (the folders are made where they are first used)."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from benchmark_site import settings as settings_module

ROOT = Path(settings.BASE_DIR)
# Variables of this process that would change what the child reads; it gets the production-like settings.
INHERITED_OUT = {"DATABASE_URL", "CELERY_BROKER_URL", "DJANGO_SETTINGS_MODULE"}


def child_env(var_dir, **variables):
    env = {key: value for key, value in os.environ.items()
           if key not in INHERITED_OUT and not key.startswith(("DJANGO_", "SILENTBENCH_"))}
    return {**env, "DJANGO_SETTINGS_MODULE": "benchmark_site.settings", "SILENTBENCH_VAR_DIR": str(var_dir),
            **variables}


def run(args, env):
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


# --- A bad value fails at start, with the variable's name ---

@pytest.mark.parametrize(("name", "value", "explained"), [
    ("DJANGO_DEBUG", "ture", "is not a boolean: use one of true/false, 1/0, yes/no, on/off"),
    ("SILENTBENCH_MAX_TIME_LIMIT", "ten minutes", "is not a whole number: expected a whole number, at least 1"),
    ("SILENTBENCH_MAX_TIME_LIMIT", "0", "is out of range: expected a whole number, at least 1"),
    ("SILENTBENCH_GPU_MEMORY_TIERS_GB", "16,24GB", "expected comma-separated whole numbers, each at least 1; '24GB'"),
    ("SILENTBENCH_ANON_RATE", "300 per minute", "is not a rate: use requests/period"),
    ("DJANGO_LOG_LEVEL", "verbose", "use one of NOTSET, DEBUG, INFO, WARNING, WARN, ERROR, CRITICAL"),
    ("SILENTBENCH_VERIFICATION_SEEDS", "101", "is out of range: expected a whole number, from 1 to 100"),
    ("SILENTBENCH_NUM_PROXIES", "-1", "is out of range: expected a whole number, from 0 to 10"),
    ("SILENTBENCH_NUM_PROXIES", "one", "is not a whole number"),
    ("SILENTBENCH_LOGIN_FAILURE_LIMIT", "0", "is out of range: expected a whole number, at least 1"),
    ("SILENTBENCH_LOGIN_COOLOFF_MINUTES", "0.5", "is out of range: expected a number, from 1 to 10080"),
    ("SILENTBENCH_LOGIN_COOLOFF_MINUTES", "1e13", "is out of range: expected a number, from 1 to 10080"),  # a week
])
def test_a_bad_value_stops_manage_py_at_start_naming_the_variable(tmp_path, name, value, explained):
    result = run(["manage.py", "check"], child_env(tmp_path / "var", **{name: value}))
    assert result.returncode != 0
    last_line = result.stderr.strip().splitlines()[-1]
    assert last_line.startswith("django.core.exceptions.ImproperlyConfigured: ")
    assert f"{name}={value!r}" in last_line and explained in last_line


@pytest.mark.parametrize(("variables", "explained"), [
    ({"SILENTBENCH_HEARTBEAT_SECONDS": "60"}, "SILENTBENCH_WORKER_STALE_SECONDS (90) must exceed twice "
                                              "SILENTBENCH_HEARTBEAT_SECONDS (60)"),
    ({"SILENTBENCH_WORKER_SEEN_MINUTES": "0"}, "SILENTBENCH_WORKER_SEEN_MINUTES (0) must be longer than"),
    ({"SILENTBENCH_MAX_REQUEST_BYTES": "1000"}, "SILENTBENCH_MAX_REQUEST_BYTES (1000) must exceed "
                                                "SILENTBENCH_SUBMISSION_MAX_TOTAL_BYTES"),
    ({"SILENTBENCH_MAX_DISK_MB": "256"}, "SILENTBENCH_COMPILE_CACHE_MB (256) must be less than "
                                         "SILENTBENCH_MAX_DISK_MB (256)"),
])
def test_settings_that_contradict_each_other_stop_the_start(tmp_path, variables, explained):
    result = run(["manage.py", "check"], child_env(tmp_path / "var", **variables))
    assert result.returncode != 0 and explained in result.stderr.strip().splitlines()[-1]


# --- What each reader accepts ---

@pytest.mark.parametrize(("value", "expected"), [
    ("true", True), ("TRUE", True), (" True ", True), ("1", True), ("yes", True), ("On", True),
    ("false", False), ("False", False), ("0", False), ("no", False), (" OFF\n", False),
])
def test_booleans_accept_the_usual_words_in_any_case(monkeypatch, value, expected):
    monkeypatch.setenv("SB_TEST_BOOL", value)
    assert settings_module.env_bool("SB_TEST_BOOL", not expected) is expected


@pytest.mark.parametrize("value", ["", "ture", "y", "2", "enabled", "yes please", "truefalse"])
def test_booleans_refuse_anything_else(monkeypatch, value):
    monkeypatch.setenv("SB_TEST_BOOL", value)
    with pytest.raises(ImproperlyConfigured, match=f"SB_TEST_BOOL={value!r} is not a boolean"):
        settings_module.env_bool("SB_TEST_BOOL", True)


def test_an_unset_variable_gives_the_default(monkeypatch):
    monkeypatch.delenv("SB_TEST_UNSET", raising=False)
    assert settings_module.env_bool("SB_TEST_UNSET", True) is True
    assert settings_module.env_int("SB_TEST_UNSET", 7, minimum=1) == 7
    assert settings_module.env_float("SB_TEST_UNSET", 1.5, minimum=0) == 1.5
    assert settings_module.env_int_list("SB_TEST_UNSET", "16,24", minimum=1) == [16, 24]


def test_numbers_within_their_range(monkeypatch):
    monkeypatch.setenv("SB_TEST_NUMBER", " 42 ")
    assert settings_module.env_int("SB_TEST_NUMBER", 1, minimum=1, maximum=42) == 42
    assert settings_module.env_float("SB_TEST_NUMBER", 1.0, minimum=0) == 42.0
    monkeypatch.setenv("SB_TEST_NUMBER", "0.5")
    assert settings_module.env_float("SB_TEST_NUMBER", 1.0, minimum=0.1) == 0.5


@pytest.mark.parametrize(("reader", "value", "message"), [
    ("env_int", "4.5", r"SB_TEST_NUMBER='4.5' is not a whole number: expected a whole number, from 1 to 10\."),
    ("env_int", "", r"SB_TEST_NUMBER='' is not a whole number"),
    ("env_int", "11", r"SB_TEST_NUMBER='11' is out of range: expected a whole number, from 1 to 10\."),
    ("env_int", "0", r"SB_TEST_NUMBER='0' is out of range"),
    ("env_float", "fast", r"SB_TEST_NUMBER='fast' is not a number: expected a number, from 1 to 10\."),
    ("env_float", "nan", r"SB_TEST_NUMBER='nan' is out of range"),
    ("env_float", "inf", r"SB_TEST_NUMBER='inf' is out of range"),
    ("env_float", "10.5", r"SB_TEST_NUMBER='10.5' is out of range"),
])
def test_numbers_refuse_what_is_not_a_number_or_out_of_range(monkeypatch, reader, value, message):
    monkeypatch.setenv("SB_TEST_NUMBER", value)
    with pytest.raises(ImproperlyConfigured, match=message):
        getattr(settings_module, reader)("SB_TEST_NUMBER", 5, minimum=1, maximum=10)


def test_a_list_of_numbers_refuses_one_bad_item(monkeypatch):
    monkeypatch.setenv("SB_TEST_LIST", "16, 24,,80")
    assert settings_module.env_int_list("SB_TEST_LIST", "", minimum=1) == [16, 24, 80]
    monkeypatch.setenv("SB_TEST_LIST", "16,0")
    with pytest.raises(ImproperlyConfigured, match=r"SB_TEST_LIST='16,0': .* each at least 1; '0' is not\."):
        settings_module.env_int_list("SB_TEST_LIST", "", minimum=1)


# --- No directory at import; each folder on first use ---

def test_reading_the_settings_makes_no_directory(tmp_path):
    """``manage.py check`` reads the settings, imports the Celery app and every app, and runs the checks."""
    var_dir = tmp_path / "fresh-var"
    result = run(["manage.py", "check"], child_env(var_dir))
    assert result.returncode == 0, result.stderr
    assert not var_dir.exists() and list(tmp_path.iterdir()) == []


def test_every_numeric_setting_reads_through_the_checked_readers():
    """No bare int()/float() of a variable is left: each would fail with a bare ValueError."""
    source = Path(settings_module.__file__).read_text()
    assert "int(os.environ" not in source and "float(os.environ" not in source


def test_the_folders_are_made_on_first_use(tmp_path):
    """The database's folder as SQLite opens it, the filesystem broker's as the Celery app is configured."""
    var_dir = tmp_path / "fresh-var"
    script = ("import django; django.setup(); "
              "from django.db import connection; connection.ensure_connection(); "
              "from benchmark_site.celery import app; print(app.conf.broker_url)")
    result = run(["-c", script], child_env(var_dir))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "filesystem://"
    assert (var_dir / "silentbench.sqlite3").is_file()
    assert {path.name for path in (var_dir / "broker").iterdir()} == {"queue", "processed", "control"}


def test_rates_and_log_levels_as_drf_and_logging_read_them(monkeypatch):
    for rate in ("300/min", "10/minutes", "5/hour", "1000/days", "2/s"):
        monkeypatch.setenv("SB_TEST_RATE", rate)
        assert settings_module.env_rate("SB_TEST_RATE", "1/min") == rate
    monkeypatch.setenv("SB_TEST_LEVEL", " info ")
    assert settings_module.env_choice("SB_TEST_LEVEL", "INFO", settings_module.LOG_LEVELS) == "INFO"
