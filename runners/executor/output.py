"""A sealed program's standard output and error: read as they are written, kept within a cap, counted whole."""
import io
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from .limits import Limits


@dataclass
class CapturedStream:
    """Keeps the head and the tail of a stream within a cap, and counts everything."""

    cap: int
    head: bytearray = field(default_factory=bytearray)
    tail: bytearray = field(default_factory=bytearray)
    total: int = 0

    def feed(self, chunk: bytes) -> None:
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
    def truncated(self) -> bool:
        return self.total > len(self.head) + len(self.tail)

    def text(self) -> str:
        """What was kept, as text a database stores (NUL, which PostgreSQL refuses, becomes U+FFFD)."""
        head = self.head.decode("utf-8", "replace")
        if not self.truncated:
            text = head + self.tail.decode("utf-8", "replace")
        else:
            skipped = self.total - len(self.head) - len(self.tail)
            text = f"{head}\n[... {skipped} bytes not kept ...]\n{self.tail.decode('utf-8', 'replace')}"
        return text.replace("\x00", "\ufffd")


def capture(stdout: io.BufferedReader, stderr: io.BufferedReader, limits: Limits, kill: Callable[[], None]
            ) -> tuple[dict[str, CapturedStream], threading.Event, list[threading.Thread]]:
    """Read both streams in threads, within the log cap; ``kill()`` once past the flood limit."""
    streams = {"stdout": CapturedStream(limits.log_cap_bytes), "stderr": CapturedStream(limits.log_cap_bytes)}
    flooded = threading.Event()

    def pump(pipe: io.BufferedReader, stream: CapturedStream) -> None:
        for chunk in iter(lambda: pipe.read1(65536), b""):
            stream.feed(chunk)
            if streams["stdout"].total + streams["stderr"].total > limits.flood_bytes and not flooded.is_set():
                flooded.set()
                kill()
        pipe.close()

    readers = [threading.Thread(target=pump, args=(pipe, streams[name]), daemon=True)
               for name, pipe in (("stdout", stdout), ("stderr", stderr))]
    for reader in readers:
        reader.start()
    return streams, flooded, readers
