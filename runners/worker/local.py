"""Start and stop a local Celery worker process (the embedded default, and the tests)."""
import os
import signal
import subprocess
import sys
from contextlib import contextmanager, nullcontext
from pathlib import Path
from urllib.parse import quote

from django.conf import settings
from django.core.management.base import CommandError
from django.db import connection

from core.cli import exit_on_sigterm

from ..progress import wait_for_campaign


def worker_command(queues="cpu", name="local", concurrency=1, prefetch_multiplier=None):
    return [sys.executable, "-m", "celery", "-A", "benchmark_site", "worker", "-Q", queues,
            "--concurrency", str(concurrency),
            *(["--prefetch-multiplier", str(prefetch_multiplier)] if prefetch_multiplier else []),
            "--pool", "prefork", "-n", f"{name}@%h", "--loglevel", "INFO", "--without-gossip", "--without-mingle"]


def database_url(settings_dict):
    """The URL of the database this process is connected to (under tests: the test database)."""
    if settings_dict["ENGINE"].endswith("sqlite3"):
        return f"sqlite:///{settings_dict['NAME']}"
    user = quote(settings_dict.get("USER") or "")
    password = f":{quote(settings_dict['PASSWORD'])}" if settings_dict.get("PASSWORD") else ""
    host = settings_dict.get("HOST") or "127.0.0.1"
    port = settings_dict.get("PORT") or 5432
    return f"postgres://{user}{password}@{host}:{port}/{settings_dict['NAME']}"


def start_worker(log_path, queues="cpu", name="local", concurrency=1, prefetch_multiplier=None):
    """A worker on the same database, broker and var directory as this process.
    Runs one at a time by default, so that timings are not disturbed by a neighbour. ``prefetch_multiplier``: the
    runs it holds per slot (default: the settings', one)."""
    env = {**os.environ, "DATABASE_URL": database_url(connection.settings_dict),
           "CELERY_BROKER_URL": settings.CELERY_BROKER_URL, "SILENTBENCH_VAR_DIR": str(settings.VAR_DIR)}
    Path(log_path).parent.mkdir(parents=True, exist_ok=True)
    log = open(log_path, "ab")
    return subprocess.Popen(worker_command(queues, name, concurrency, prefetch_multiplier), cwd=settings.BASE_DIR,
                            env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


@contextmanager
def local_worker(log_path, **options):
    """A worker for the length of a command. SIGTERM to the command stops the worker too: it runs
    in its own session (so that Ctrl-C reaches only the command) and would otherwise outlive it."""
    process = start_worker(log_path, **options)
    previous = signal.signal(signal.SIGTERM, exit_on_sigterm)
    try:
        yield process
    finally:
        signal.signal(signal.SIGTERM, previous)
        stop_process(process)


def stop_process(process, timeout=20):
    """Warm shutdown first (Celery finishes nothing new), then kill the whole group."""
    if process.poll() is None:
        try:
            os.killpg(process.pid, signal.SIGTERM)
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        except ProcessLookupError:
            pass


def log_tail(log_path, lines=30):
    path = Path(log_path)
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""


def wait_with_local_worker(campaign, write, name, concurrency=1, start=True, queues="cpu", timeout=None):
    """Wait for ``campaign`` to finish (or ``timeout`` seconds: the progress then says what is left), with a local
    worker consuming ``queues`` for the length of the wait (``start``), or relying on workers already consuming
    the queue. Fails loudly if the local worker dies."""
    logs = settings.VAR_DIR / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    log = logs / f"{name}-worker.log"
    with local_worker(log, queues=queues, name=name, concurrency=concurrency) if start else nullcontext() as worker:
        def watchdog():
            if worker is not None and worker.poll() is not None:
                raise CommandError(f"The local worker exited:\n{log_tail(log)}")

        return wait_for_campaign(campaign, write, timeout=timeout, watchdog=watchdog)
