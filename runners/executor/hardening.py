"""The worker's own hardening: what keeps the secrets of the process that starts runs from the runs."""
import ctypes
import os
import re

_PR_SET_DUMPABLE = 4
SECRET_NAME = re.compile(r"SECRET|PASSWORD|PASSWD|TOKEN|CREDENTIAL|^DATABASE_URL$|BROKER_URL$|CACHE_URL$")
URL_WITH_CREDENTIALS = re.compile(rb"^[A-Za-z][\w+.-]*://[^/@\s]*@")

_libc = ctypes.CDLL(None, use_errno=True)


def hide_from_reproducers() -> None:
    """Keep the secrets in this process's environment (database and broker URLs, the secret key) from
    the reproducers it starts. Idempotent; forked children (a worker's pool) inherit it.

    - Non-dumpable: a process of the same user can no longer open its /proc/<pid>/environ or memory,
      nor trace it (Landlock does not stop that on every kernel). A root reproducer could, with
      CAP_SYS_PTRACE, which the confinement drops (runners.executor.confinement).
    - The values of secret variables are wiped from the environment block that /proc/<pid>/environ
      shows (root can read that file of another root process even so). ``os.environ`` and the C
      environment keep them, in memory /proc/<pid>/mem guards.
    """
    _libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)
    try:
        with open("/proc/self/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
        start, end = int(fields[47]), int(fields[48])  # env_start, env_end: fields 50 and 51 of proc(5)
    except (OSError, IndexError, ValueError):
        return
    block, offset, wiped = ctypes.string_at(start, end - start), 0, []
    for entry in block.split(b"\0"):
        name, equals, value = entry.partition(b"=")
        if equals and value and (SECRET_NAME.search(name.decode(errors="replace"))
                                 or URL_WITH_CREDENTIALS.match(value)):
            ctypes.memset(start + offset + len(name) + 1, 0, len(value))
            wiped.append(os.fsdecode(name))
        offset += len(entry) + 1
    for variable in wiped:  # the C environment pointed into the block: give it the values back, elsewhere
        if variable in os.environ:
            os.putenv(variable, os.environ[variable])
