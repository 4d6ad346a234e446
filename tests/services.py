"""Private PostgreSQL and Redis servers for tests that break them (fault, backup and load tests).

Each starts on a free loopback port in a temporary directory and is thrown away afterwards; the
machine's shared services (5432, 6379) are never touched. As root, PostgreSQL runs as the
``postgres`` OS user (it refuses to run as root). ``django_on(server)`` and ``celery_on(server)``
point this process's Django connection and Celery producer at them; real workers started with
``runners.worker.local.start_worker`` inside those blocks follow, as it passes the URLs on.
"""
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import dj_database_url
import pytest

PG_BIN = Path(os.environ.get("SILENTBENCH_PG_BIN", "/usr/lib/postgresql/15/bin"))


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_for_port(port, timeout=30, process=None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"the server exited with code {process.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise TimeoutError(f"nothing answers on port {port} after {timeout} s")


def _as_postgres(argv):
    """PostgreSQL refuses root: as root, run as the ``postgres`` user; otherwise as ourselves."""
    return ["runuser", "-u", "postgres", "--", *argv] if os.geteuid() == 0 else argv


class PostgresServer:
    """A throwaway cluster: ``start``, ``stop`` (fast shutdown), ``kill`` (SIGKILL, like a crash), ``restart``."""

    def __init__(self):
        self.port = free_port()
        self.root = Path(tempfile.mkdtemp(prefix="silentbench-pg-"))
        self.data = self.root / "data"
        self.log = self.root / "postgres.log"
        self.process = None
        if os.geteuid() == 0:
            account = pwd.getpwnam("postgres")
            os.chown(self.root, account.pw_uid, account.pw_gid)
        subprocess.run(_as_postgres([str(PG_BIN / "initdb"), "-D", str(self.data), "-U", "postgres",
                                     "--auth=trust", "--no-sync", "-E", "UTF8", "--locale=C.UTF-8"]),
                       check=True, capture_output=True)

    def url(self, name="silentbench"):
        return f"postgres://postgres@127.0.0.1:{self.port}/{name}"

    def start(self):
        # fsync off: a crash of this throwaway cluster must not slow the tests down, and kill() is a
        # crash of the server process, not of the machine.
        self.process = subprocess.Popen(
            _as_postgres([str(PG_BIN / "postgres"), "-D", str(self.data), "-p", str(self.port),
                          "-c", "listen_addresses=127.0.0.1", "-c", f"unix_socket_directories={self.root}",
                          "-c", "fsync=off", "-c", "max_connections=200"]),
            stdout=open(self.log, "ab"), stderr=subprocess.STDOUT, start_new_session=True)
        wait_for_port(self.port, process=self.process)
        for _ in range(100):  # the port opens a little before connections are accepted
            ready = [str(PG_BIN / "pg_isready"), "-q", "-h", "127.0.0.1", "-p", str(self.port)]
            if subprocess.run(ready).returncode == 0:
                return self
            time.sleep(0.1)
        raise TimeoutError("PostgreSQL does not accept connections")

    def stop(self):
        if self.process and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGINT)  # fast shutdown: disconnects clients, rolls back
            self.process.wait(timeout=30)

    def kill(self):
        if self.process and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def restart(self, down_seconds=0.0):
        self.stop()
        time.sleep(down_seconds)
        return self.start()

    def createdb(self, name):
        subprocess.run([str(PG_BIN / "createdb"), "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", name],
                       check=True, capture_output=True)
        return self.url(name)

    def close(self):
        self.kill()
        shutil.rmtree(self.root, ignore_errors=True)


class RedisServer:
    """A Redis without persistence: a restart loses every message, as a production crash would."""

    def __init__(self):
        self.port = free_port()
        self.root = Path(tempfile.mkdtemp(prefix="silentbench-redis-"))
        self.process = None

    def url(self, db=0):
        return f"redis://127.0.0.1:{self.port}/{db}"

    def start(self):
        self.process = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", str(self.root), "--logfile", str(self.root / "redis.log")],
            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True)
        wait_for_port(self.port, process=self.process)
        return self

    def kill(self):
        if self.process and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def restart(self, down_seconds=0.0):
        """Kill and start again: everything it held (queued and unacknowledged messages) is gone."""
        self.kill()
        time.sleep(down_seconds)
        return self.start()

    def close(self):
        self.kill()
        shutil.rmtree(self.root, ignore_errors=True)


def _require(binary):
    if not (Path(binary).exists() or shutil.which(binary)):
        pytest.fail(f"{binary} is not installed; fault tests need it (see bin/setup)")


@pytest.fixture(scope="session")
def own_postgres():
    _require(PG_BIN / "postgres")
    server = PostgresServer().start()
    yield server
    server.close()


@pytest.fixture(scope="session")
def own_redis():
    _require("redis-server")
    server = RedisServer().start()
    yield server
    server.close()


@contextmanager
def django_on(url):
    """This process's default database connection on ``url`` for the block, then back as it was.
    The caller migrates it if needed (``call_command("migrate")``)."""
    from django.db import connections

    previous = connections.settings["default"]
    connections["default"].close()
    settings_dict = dj_database_url.parse(url, conn_max_age=0, conn_health_checks=True)
    connections.settings["default"] = connections.configure_settings({"default": settings_dict})["default"]
    del connections["default"]
    try:
        yield connections["default"]
    finally:
        connections["default"].close()
        connections.settings["default"] = previous
        del connections["default"]


@contextmanager
def celery_on(url):
    """This process's Celery producer (``enqueue_runs``) and ``settings.CELERY_BROKER_URL`` on ``url``."""
    from django.conf import settings

    from benchmark_site.celery import app

    def reset():  # kombu keeps one pool per broker URL: forget ours, never close it (others share it)
        app._pool = None
        app.amqp._producer_pool = None

    # Celery prefers the CELERY_BROKER_URL environment variable to its configuration.
    previous = (app.conf.broker_url, app.conf.broker_transport_options, settings.CELERY_BROKER_URL,
                os.environ.get("CELERY_BROKER_URL"))
    reset()
    app.conf.broker_url, app.conf.broker_transport_options = url, {"visibility_timeout": 3600}
    settings.CELERY_BROKER_URL = os.environ["CELERY_BROKER_URL"] = url
    try:
        yield app
    finally:
        reset()
        app.conf.broker_url, app.conf.broker_transport_options, settings.CELERY_BROKER_URL, environment = previous
        if environment is None:
            os.environ.pop("CELERY_BROKER_URL", None)
        else:
            os.environ["CELERY_BROKER_URL"] = environment
