"""Load benchmark: the pages under concurrent HTTP clients, and runs through the broker against
running the same reproducers directly (``manage.py bench_load``, ``manage.py bench_runs --throughput``).

Prints figures; never asserts. See docs/performance.md, "Load (issue 6)".
"""
import http.client
import math
import os
import runpy
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from django.conf import settings
from django.db.models import Count

from bugs.models import Bug
from core.enums import Variant
from devtools.pages import busiest_bug, busiest_detector
from runners.models import Run, RunStatus
from runners.plans import CampaignPlan


def percentile(values, share):
    """Nearest-rank percentile (``share`` in 0..1)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(share * len(ordered)) - 1)] if ordered else float("nan")


# --- part a: pages and API endpoints under concurrent clients ---

def endpoints():
    """(label, path) of what is measured, chosen on the configured database (the busiest bug, the
    largest campaign)."""
    listed = [("landing", "/"), ("catalog", "/catalog/")]
    bug = busiest_bug()
    bug_id = bug[0] if bug else Bug.objects.values_list("bug_id", flat=True).first()
    if bug_id:
        listed.append((f"bug page ({bug_id}{', %d runs' % bug[1] if bug else ''})", f"/bugs/{bug_id}/"))
    listed += [("results (stored evaluation)", "/results/"), ("leaderboard", "/leaderboard/"),
               ("campaign list", "/campaigns/")]
    largest = (Run.objects.filter(campaign__isnull=False).values("campaign").annotate(n=Count("id"))
               .order_by("-n").first())
    if largest:
        listed.append((f"largest campaign ({largest['n']} runs)", f"/campaigns/{largest['campaign']}/"))
    detector = busiest_detector()
    if detector:
        name = detector[0]
        listed += [(f"detector page ({name}, {detector[1]} runs)", f"/detectors/{name}/"),
                   (f"run list: {name}'s detections (stored evaluation)",
                    f"/results/runs/?detector={name}&variant=buggy&verdict=detected")]
        if largest:
            listed.append((f"run list: {name}'s false alarms (largest campaign)",
                           f"/results/runs/?campaign={largest['campaign']}&detector={name}&verdict=false-alarm"))
    listed += [("API runs", "/api/runs/"), ("API bugs", "/api/bugs/"), ("API results", "/api/results/"),
               ("export: detection table, LaTeX", "/results/detection.tex"),
               ("export: detection table, CSV", "/results/detection.csv")]
    if largest:
        listed.append((f"export: live campaign CSV ({largest['n']} runs)",
                       f"/results/detection.csv?campaign={largest['campaign']}"))
    return listed


@dataclass
class LoadResult:
    latencies: list = field(default_factory=list)  # seconds, successful (2xx) requests only
    statuses: dict = field(default_factory=dict)
    errors: int = 0
    bytes: int = 0
    elapsed: float = 0.0

    def row(self):
        ok = len(self.latencies)
        other = ", ".join(f"{code}: {n}" for code, n in sorted(self.statuses.items()) if code != 200)
        if self.errors:
            other = ", ".join(filter(None, [other, f"errors: {self.errors}"]))
        return {"requests": ok, "p50": 1000 * percentile(self.latencies, 0.5) if ok else float("nan"),
                "p95": 1000 * percentile(self.latencies, 0.95) if ok else float("nan"),
                "rps": ok / self.elapsed if self.elapsed else 0.0, "kib": self.bytes / max(ok, 1) / 1024,
                "other": other or "-"}


class Client:
    """One client's HTTP/1.1 connection, kept while the server keeps it open, as a browser keeps it: gunicorn's
    sync workers close it after each response, its threaded workers keep it a few seconds (keep-alive)."""

    def __init__(self, base, timeout):
        self.url, self.timeout, self.connection = urlsplit(base), timeout, None

    def get(self, path):
        """One GET; (status, bytes)."""
        if self.connection is None:
            self.connection = http.client.HTTPConnection(self.url.hostname, self.url.port or 80, timeout=self.timeout)
        try:
            self.connection.request("GET", self.url.path.rstrip("/") + path, headers={"Host": self.url.hostname})
            response = self.connection.getresponse()
            size = len(response.read())
        except (OSError, http.client.HTTPException):
            self.close()
            raise
        if response.will_close:
            self.close()
        return response.status, size

    def close(self):
        if self.connection is not None:
            self.connection.close()
            self.connection = None


def hammer(base, path, concurrency, duration, max_requests, timeout=120):
    """``concurrency`` clients (threads, each with its ``Client``) GET ``path`` back to back until ``duration``
    seconds have passed (a request started before then completes) or ``max_requests`` were sent."""
    result, lock = LoadResult(), threading.Lock()
    sent = [0]
    deadline = time.perf_counter() + duration

    def client():
        connection = Client(base, timeout)
        while True:
            with lock:
                if sent[0] >= max_requests or time.perf_counter() >= deadline:
                    connection.close()
                    return
                sent[0] += 1
            started = time.perf_counter()
            try:
                status, size = connection.get(path)
            except (OSError, http.client.HTTPException):
                with lock:
                    result.errors += 1
                continue
            latency = time.perf_counter() - started
            with lock:
                result.statuses[status] = result.statuses.get(status, 0) + 1
                if 200 <= status < 300:
                    result.latencies.append(latency)
                    result.bytes += size

    started = time.perf_counter()
    threads = [threading.Thread(target=client, daemon=True) for _ in range(concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    result.elapsed = time.perf_counter() - started
    return result


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_until_serving(base, process, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"gunicorn exited with code {process.returncode}")
        try:
            with urllib.request.urlopen(f"{base}/healthz", timeout=5) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.3)
    raise RuntimeError(f"gunicorn did not answer on {base} within {timeout} s")


GUNICORN_CONFIG = "docker/gunicorn.conf.py"  # the web image's, and compose's


def gunicorn_settings(worker_class=None, workers=None, threads=None):
    """(worker class, processes, threads per process): GUNICORN_CONFIG's, each replaced where given."""
    config = runpy.run_path(str(settings.BASE_DIR / GUNICORN_CONFIG))
    return worker_class or config["worker_class"], workers or config["workers"], threads or config["threads"]


@contextmanager
def gunicorn(database_url, workers, log_path, port=None, worker_class=None, threads=None):
    """gunicorn on a free loopback port over ``database_url``, started as the web image starts it (with
    GUNICORN_CONFIG), with ``workers`` processes and, where given, this worker class and threads per process
    (``gunicorn_settings``); yields the base URL. The anonymous API throttle is lifted: all clients come from one
    address, and the endpoint is measured, not the 429. Lifted per second, not per minute: the throttle reads and
    writes the times of its window's requests at each request, and a second at these rates holds about as many as
    a production minute (300), where a minute would hold thousands."""
    worker_class, workers, threads = gunicorn_settings(worker_class, workers, threads)
    port = port or free_port()
    env = {**os.environ, "DATABASE_URL": database_url, "SILENTBENCH_VAR_DIR": str(settings.VAR_DIR),
           "SILENTBENCH_ANON_RATE": "1000000/s"}
    argv = [sys.executable, "-m", "gunicorn", "benchmark_site.wsgi:application", "--config", GUNICORN_CONFIG,
            "--bind", f"127.0.0.1:{port}", "--worker-class", worker_class, "--workers", str(workers),
            "--threads", str(threads), "--timeout", "300", "--access-logfile", "-"]
    with open(log_path, "ab") as log:
        process = subprocess.Popen(argv, cwd=settings.BASE_DIR, env=env, stdout=log, stderr=subprocess.STDOUT,
                                   start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until_serving(base, process)
        yield base
    finally:
        from runners.worker.local import stop_process

        stop_process(process)


# --- part b: runs through the broker and workers, against the same runs directly ---

def run_specs(versions, count):
    """``count`` (version, variant, seed) triples cycling over the versions and both variants."""
    combos = [(version, variant) for version in versions for variant in Variant.values]
    return [(*combos[i % len(combos)], i // len(combos)) for i in range(count)]


def run_direct(specs, detector, concurrency):
    """Execute the runs in the worker's sandbox (``runners.execution.execute``) from a thread pool,
    no broker and no database writes; returns (wall seconds, failures, each run's reproducer wall time)."""
    from runners.execution import execute

    def one(spec):
        version, variant, seed = spec
        run = Run(reproducer_version=version, detector=detector, variant=variant, seed=seed,
                  steps=version.default_steps)
        return execute(run)

    started = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        outcomes = list(pool.map(one, specs))
    wall = time.perf_counter() - started
    return wall, sum(not outcome.succeeded for outcome in outcomes), [outcome.wall_seconds for outcome in outcomes]


def run_through_workers(specs, detector, workers, log_dir, timeout=1800):
    """Start ``workers`` local worker processes (one run at a time each), queue all runs as one
    campaign, wait for it; returns the finished runs (with their timestamps)."""
    from runners.actions.campaigns import do_create_campaign
    from runners.progress import wait_for_campaign
    from runners.worker.local import start_worker, stop_process

    with ExitStack() as stack:
        for i in range(workers):
            process = start_worker(log_dir / f"bench-load-{i}.log", name=f"benchload{i}")
            stack.callback(stop_process, process)
        time.sleep(5)  # let the workers connect before the clock starts
        by_version = {}
        for version, variant, seed in specs:
            by_version.setdefault((version.pk, variant), (version, variant, []))[2].append(seed)
        campaigns = [do_create_campaign("bench_load throughput",
                                        CampaignPlan.build([version], [detector], [variant], seeds), acting_user=None)
                     for version, variant, seeds in by_version.values()]
        for campaign in campaigns:
            wait_for_campaign(campaign, lambda line: None, timeout=timeout, interval=0.2)
    return list(Run.objects.filter(campaign__in=campaigns).order_by("queued_at"))


def idle_dispatch(specs, detector, log_dir, timeout=600):
    """Queued-to-started latency of single runs with an idle worker waiting (no backlog)."""
    from runners.actions.campaigns import do_create_campaign
    from runners.progress import wait_for_campaign
    from runners.worker.local import local_worker

    latencies = []
    with local_worker(log_dir / "bench-load-idle.log", name="benchloadidle"):
        time.sleep(5)
        for version, variant, seed in specs:
            campaign = do_create_campaign("bench_load dispatch",
                                          CampaignPlan.build([version], [detector], [variant],
                                                             [seed]), acting_user=None)
            wait_for_campaign(campaign, lambda line: None, timeout=timeout, interval=0.05)
            run = campaign.runs.get()
            latencies.append((run.started_at - run.queued_at).total_seconds())
            time.sleep(0.5)  # the worker is back to waiting on the broker
    return latencies


def throughput_summary(runs, direct, workers, idle=None):
    """Lines of Markdown with the figures of part b. ``direct``: the results of ``run_direct`` before
    and after the runs through the broker; the ratio uses their mean, as the machine's load drifts."""
    waits = [(run.started_at - run.queued_at).total_seconds() for run in runs if run.started_at]
    wall = (max(run.finished_at for run in runs) - min(run.queued_at for run in runs)).total_seconds()
    executing = [run.wall_seconds for run in runs if run.wall_seconds is not None]
    around = [(run.finished_at - run.started_at).total_seconds() - run.wall_seconds
              for run in runs if run.wall_seconds is not None]
    failed = sum(run.status != RunStatus.SUCCEEDED for run in runs)
    direct_wall = statistics.mean(wall_seconds for wall_seconds, _, _ in direct)
    direct_runs = [seconds for _, _, each in direct for seconds in each if seconds is not None]
    median = lambda values: f"{statistics.median(values):.2f}" if values else "-"  # noqa: E731
    each = lambda values, spec: " / ".join(format(value, spec) for value in values)  # noqa: E731
    lines = [
        f"| | through the broker ({workers} workers) | direct (sandbox, {workers} threads), before / after |",
        "|---|---:|---:|",
        f"| runs | {len(runs)} ({failed} not succeeded) | {len(runs)} ({each([f for _, f, _ in direct], 'd')} "
        f"failed) |",
        f"| wall time, first queued to last finished (s) | {wall:.1f} | {each([w for w, _, _ in direct], '.1f')} |",
        f"| runs per minute | {60 * len(runs) / wall:.1f} | "
        f"{each([60 * len(runs) / w for w, _, _ in direct], '.1f')} |",
        f"| queued→started p50 / p95 (s), backlog of {len(runs)} | {percentile(waits, 0.5):.2f} / "
        f"{percentile(waits, 0.95):.2f} | - |",
        f"| reproducer wall time in the sandbox, median (s) | {median(executing)} | {median(direct_runs)} |",
        f"| worker time around the reproducer (claim, environment, results), median (s) | {median(around)} | - |",
    ]
    if idle:
        lines.append(f"| queued→started p50 / p95 (ms), idle worker, n={len(idle)} | "
                     f"{1000 * percentile(idle, 0.5):.0f} / {1000 * percentile(idle, 0.95):.0f} | - |")
    lines.append(f"\nratio broker / direct wall time (mean of before and after): **{wall / direct_wall:.2f}**")
    return lines
