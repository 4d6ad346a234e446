"""Run an untrusted program in a subprocess with limits, and say clearly how it ended.

Pure Python (no Django), so that it can be tested and reused on its own.
"""
import os
import resource
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Limits:
    time_limit_seconds: float
    memory_mb: int
    log_cap_bytes: int = 64 * 1024
    flood_bytes: int = 32 * 1024 * 1024
    file_size_mb: int = 256


@dataclass
class CapturedStream:
    """Keeps the head and the tail of a stream within a cap, and counts everything."""

    cap: int
    head: bytearray = field(default_factory=bytearray)
    tail: bytearray = field(default_factory=bytearray)
    total: int = 0

    def feed(self, chunk):
        self.total += len(chunk)
        half = self.cap // 2
        room = half - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if chunk:
            self.tail += chunk
            if len(self.tail) > half:
                del self.tail[: len(self.tail) - half]

    @property
    def truncated(self):
        return self.total > len(self.head) + len(self.tail)

    def text(self):
        head = self.head.decode("utf-8", "replace")
        if not self.truncated:
            return head + self.tail.decode("utf-8", "replace")
        skipped = self.total - len(self.head) - len(self.tail)
        return f"{head}\n[... {skipped} bytes not kept ...]\n{self.tail.decode('utf-8', 'replace')}"


@dataclass
class SandboxResult:
    exit_code: int | None
    wall_seconds: float
    stdout: str
    stderr: str
    output_truncated: bool
    timed_out: bool = False
    flooded: bool = False

    @property
    def signal_name(self):
        if self.exit_code is not None and self.exit_code < 0:
            try:
                return signal.Signals(-self.exit_code).name
            except ValueError:
                return f"signal {-self.exit_code}"
        return None

    def failure_reason(self, limits):
        """A sentence for a human, or '' when the program ended normally with exit code 0."""
        if self.timed_out:
            return (f"Time limit exceeded: still running after {limits.time_limit_seconds:g} s; "
                    "the process group was killed.")
        if self.flooded:
            return f"Output flood: more than {limits.flood_bytes} bytes on stdout/stderr; the process group was killed."
        if self.exit_code == 0:
            return ""
        last_line = next((line for line in reversed(self.stderr.strip().splitlines()) if line.strip()), "")
        if looks_out_of_memory(self.stderr):
            return f"Out of memory: exceeded the memory limit of {limits.memory_mb} MB. {last_line}".strip()
        if self.signal_name:
            return f"Crashed: killed by {self.signal_name}. {last_line}".strip()
        return f"Crashed: exited with code {self.exit_code}. {last_line}".strip()


OOM_MARKERS = ("MemoryError", "std::bad_alloc", "can't allocate memory", "Cannot allocate memory", "out of memory")


def looks_out_of_memory(stderr):
    return any(marker in stderr for marker in OOM_MARKERS)


def _apply_limits(limits):
    def preexec():
        memory = limits.memory_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
        file_size = limits.file_size_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_FSIZE, (file_size, file_size))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

    return preexec


def _kill_group(process):
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run_sandboxed(argv, workdir, env, limits):
    """Run ``argv`` in ``workdir`` with exactly ``env``; never raises for the program's misbehaviour."""
    started = time.monotonic()
    process = subprocess.Popen(
        argv,
        cwd=workdir,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,  # its own process group, so that ranks and strays die with it
        preexec_fn=_apply_limits(limits),
    )
    streams = {"stdout": CapturedStream(limits.log_cap_bytes), "stderr": CapturedStream(limits.log_cap_bytes)}
    flooded = threading.Event()

    def pump(pipe, stream):
        for chunk in iter(lambda: pipe.read1(65536), b""):
            stream.feed(chunk)
            if streams["stdout"].total + streams["stderr"].total > limits.flood_bytes and not flooded.is_set():
                flooded.set()
                _kill_group(process)
        pipe.close()

    readers = [
        threading.Thread(target=pump, args=(process.stdout, streams["stdout"]), daemon=True),
        threading.Thread(target=pump, args=(process.stderr, streams["stderr"]), daemon=True),
    ]
    for reader in readers:
        reader.start()
    timed_out = False
    try:
        process.wait(timeout=limits.time_limit_seconds)
    except subprocess.TimeoutExpired:
        timed_out = True
    _kill_group(process)  # also reaps ranks or children the program left behind
    process.wait()
    for reader in readers:
        reader.join(timeout=5)
    return SandboxResult(
        exit_code=process.returncode,
        wall_seconds=time.monotonic() - started,
        stdout=streams["stdout"].text(),
        stderr=streams["stderr"].text(),
        output_truncated=streams["stdout"].truncated or streams["stderr"].truncated,
        timed_out=timed_out,
        flooded=flooded.is_set(),
    )
