"""docs/operations.md: the health endpoints, and the documented backup and restore, run as written."""
import os
import re
import subprocess
import sys
import uuid

import pytest
from django.apps import apps
from django.conf import settings
from django.contrib.auth.models import User
from django.contrib.contenttypes.models import ContentType
from django.core.management import call_command
from django.db import OperationalError
from django.db.migrations.executor import MigrationExecutor
from django.test import Client

from accounts.actions import do_create_api_token
from accounts.models import ApiToken
from benchmark_site import health
from bugs.models import ReproducerVersion
from devtools.synthetic import seed_history
from evaluation.models import Evaluation
from runners.models import Alarm, Run

from .factories import MaintainerFactory, UserFactory
from .services import django_on

OPERATIONS = settings.BASE_DIR / "docs" / "operations.md"


# --- health endpoints ---

@pytest.mark.django_db
def test_healthz_answers_with_the_database_reachable(client):
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok", "database": "ok"}
    assert "no-cache" in response["Cache-Control"]


@pytest.mark.django_db
def test_healthz_is_503_when_the_database_fails(client, monkeypatch):
    def unreachable():
        raise OperationalError("connection refused to postgres://secret@db")

    monkeypatch.setattr(health, "check_database", unreachable)
    response = client.get("/healthz")
    assert response.status_code == 503
    assert response.json() == {"status": "unavailable", "database": "error: OperationalError"}
    assert b"secret" not in response.content  # the type only, never the message


@pytest.mark.django_db
def test_ready_is_503_while_migrations_are_pending(client, monkeypatch):
    assert client.get("/healthz/ready").status_code == 200
    monkeypatch.setattr(MigrationExecutor, "migration_plan", lambda self, targets: [("pending", False)])
    response = client.get("/healthz/ready")
    assert response.status_code == 503
    assert response.json()["migrations"] == "1 unapplied migration(s)"


@pytest.mark.django_db
def test_health_endpoints_take_no_writes(client):
    assert client.post("/healthz").status_code == 405


# --- backup and restore, exactly as documented ---

def documented_block(name):
    """The code block under ``<!-- tests/test_operations.py runs this block: NAME -->``."""
    match = re.search(rf"<!-- tests/test_operations.py runs this block: {name} -->\n```bash\n(.*?)```",
                      OPERATIONS.read_text(), re.S)
    assert match, f"docs/operations.md has no tested {name} block"
    return match.group(1)


def run_documented(name, database_url, backup_file):
    env = {**os.environ, "DATABASE_URL": database_url, "BACKUP_FILE": str(backup_file),
           "PATH": os.pathsep.join([os.path.dirname(sys.executable), os.environ["PATH"]])}
    result = subprocess.run(["bash", "-euo", "pipefail", "-c", documented_block(name)], cwd=settings.BASE_DIR,
                            env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, f"{name} failed:\n{result.stdout}\n{result.stderr}"
    return result


def row_counts():
    return {model._meta.label: model.objects.count() for model in apps.get_models()}


def some_records():
    """A few whole records from each kind of state, as plain values."""
    newest_run = Run.objects.filter(alarms__isnull=False).order_by("-id").first()
    return {
        "versions": list(ReproducerVersion.objects.order_by("id").values("id", "content_hash", "files", "manifest")),
        "run": Run.objects.filter(pk=newest_run.pk).values().get(),
        "alarms": list(Alarm.objects.filter(run=newest_run).order_by("id").values()),
        "first_alarms": list(Alarm.objects.order_by("id").values()[:5]),
        "users": list(User.objects.order_by("id").values("username", "password", "is_staff", "groups__name")),
        "tokens": list(ApiToken.objects.order_by("id").values("user__username", "prefix", "key_hash", "revoked_at")),
        "evaluation": Evaluation.objects.order_by("id").values("campaign_id", "parameters", "tables").first(),
    }


def fill(url):
    """Catalog, a small synthetic history (campaigns, runs, alarms, stability checks, an evaluation),
    a maintainer with an API token and a contributor; returns the token's secret."""
    with django_on(url):
        call_command("migrate", verbosity=0)
        call_command("load_catalog", verbosity=0)
        seed_history(runs=300, alarms=2000, campaigns=3, seed=6, log=lambda *args: None)
        maintainer = MaintainerFactory(username="ops-maintainer")
        UserFactory(username="ops-contributor")
        _, secret = do_create_api_token("nightly script", acting_user=maintainer)
        return secret, row_counts(), some_records()


@pytest.mark.faults
def test_documented_backup_restores_everything_into_a_fresh_database(own_postgres, django_db_blocker,
                                                                     tmp_path):
    suffix = uuid.uuid4().hex[:8]
    source, target = own_postgres.createdb(f"ops_source_{suffix}"), own_postgres.createdb(f"ops_restored_{suffix}")
    backup_file = tmp_path / "silentbench.dump"
    try:
        with django_db_blocker.unblock():
            secret, counts, records = fill(source)
            assert counts["runners.Run"] == 300 and counts["runners.Alarm"] == 2000
            assert counts["accounts.ApiToken"] == 1 and counts["evaluation.Evaluation"] >= 1

            run_documented("backup", source, backup_file)
            assert backup_file.stat().st_size > 0 and not backup_file.with_suffix(".dump.partial").exists()
            run_documented("restore", target, backup_file)

            with django_on(target):
                assert row_counts() == counts
                assert some_records() == records
                client = Client()
                bug_id = Run.objects.filter(reproducer_version__reproducer__bug__isnull=False).values_list(
                    "reproducer_version__reproducer__bug__bug_id", flat=True).first()
                page = client.get(f"/bugs/{bug_id}/")
                assert page.status_code == 200 and bug_id in page.content.decode()
                assert client.get("/results/").status_code == 200
                assert client.get("/healthz/ready").status_code == 200
                listed, url = 0, "/api/runs/"
                while url:  # the runs API pages by cursor, 50 runs a page
                    api = client.get(url, HTTP_AUTHORIZATION=f"Token {secret}")
                    assert api.status_code == 200
                    listed, url = listed + len(api.json()["results"]), api.json()["next"]
                assert listed == 300
                assert client.get("/api/tokens/", HTTP_AUTHORIZATION=f"Token {secret}").json()["count"] == 1
                # Sequences came along: new rows do not collide with restored ones.
                assert UserFactory(username="after-restore").pk > max(u.pk for u in User.objects.exclude(
                    username="after-restore"))

            # Restoring over a database that has data is refused, and leaves it as it was.
            refused = subprocess.run(["bin/restore", str(backup_file)], cwd=settings.BASE_DIR, capture_output=True,
                                     text=True, env={**os.environ, "DATABASE_URL": target})
            assert refused.returncode == 1 and "new, empty" in refused.stderr
            with django_on(target):
                assert User.objects.filter(username="after-restore").exists()
    finally:
        ContentType.objects.clear_cache()  # ids of the private databases must not leak into other tests
