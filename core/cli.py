"""Helpers shared by the management commands."""
import argparse
import subprocess

from django.conf import settings


def comma_list(value):
    """``--bugs DS-1801, SO-60335387`` -> ["DS-1801", "SO-60335387"]: an argparse ``type``."""
    return [item.strip() for item in value.split(",") if item.strip()]


def int_list(value):
    """``--seeds 0,1,2`` -> [0, 1, 2]: an argparse ``type``, so a typo is a usage error, not a traceback."""
    try:
        return [int(item) for item in comma_list(value)]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a comma-separated list of whole numbers") from None


def positive_int(value):
    """An argparse ``type`` for counts that must be at least 1 (seeds, pairs, steps, concurrency)."""
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number < 1:
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number of at least 1")
    return number


def exit_on_sigterm(signum, frame):
    """A SIGTERM handler: leave by SystemExit, so that ``finally`` blocks run (a sandboxed program is killed,
    runs being timed are given up) as they do on Ctrl-C."""
    raise SystemExit(128 + signum)


def line_writer(stream):
    """Write progress lines: rewritten in place on a terminal, one per line otherwise (logs, CI)."""
    if not stream.isatty():
        return lambda line: (stream.write(line + "\n"), stream.flush())
    return lambda line: (stream.write("\r\033[K" + line), stream.flush())


def source_commit():
    """The commit of the code that ran the evaluation (what its citation names), or "" outside a git checkout."""
    try:
        result = subprocess.run(["git", "rev-parse", "HEAD"], cwd=settings.BASE_DIR, capture_output=True, text=True,
                                timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return result.stdout.strip() if result.returncode == 0 else ""
