"""Start and stop a local Celery worker process (the embedded default, and the tests)."""
import os
import signal
import subprocess
import sys
from pathlib import Path

from django.conf import settings


def worker_command(queues="cpu", name="local"):
    return [sys.executable, "-m", "celery", "-A", "benchmark_site", "worker", "-Q", queues, "--concurrency", "1",
            "--pool", "prefork", "-n", f"{name}@%h", "--loglevel", "INFO", "--without-gossip", "--without-mingle"]


def start_worker(log_path, env=None, queues="cpu", name="local"):
    log = open(log_path, "ab")
    return subprocess.Popen(worker_command(queues, name), cwd=settings.BASE_DIR, env=env or os.environ.copy(),
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


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
