"""gunicorn's settings for the site: the web image (docker/Dockerfile), compose and ``manage.py bench_load`` start
gunicorn with ``--config docker/gunicorn.conf.py``; options on the command line (the address to bind) come on top.

Chosen by measurement (docs/performance.md, "Load"): threaded workers (gthread), one process per core and eight
threads each. A request spends part of its time waiting for PostgreSQL or the cache, and another thread of the
process runs meanwhile; the processes use the cores, which the threads of one process cannot (Python's lock).
Threaded workers also keep a client's connection open between requests, which sync workers close.
``WEB_CONCURRENCY`` (processes) and ``GUNICORN_THREADS`` (threads per process) override the choice, as whole
numbers of at least 1 (unset or empty: the choice above); anything else stops gunicorn at start."""
import os

PROCESSES_PER_CORE = 1
THREADS = 8


def whole_number(name, default):
    """The variable ``name`` as a whole number of at least 1; unset or empty gives ``default``."""
    raw = os.environ.get(name, "")
    if raw == "":
        return default
    if not raw.strip().isdigit() or int(raw) < 1:
        raise SystemExit(f"{name}={raw!r} is not a whole number of at least 1.")
    return int(raw)


def cores():
    """The cores this process may run on (a container's CPU set), or the machine's where that is not known."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


worker_class = "gthread"
workers = whole_number("WEB_CONCURRENCY", PROCESSES_PER_CORE * cores())
threads = whole_number("GUNICORN_THREADS", THREADS)
