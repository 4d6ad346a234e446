"""Reading and checking a submitted reproducer before anything is stored: files or one archive in,
every problem out at once, each in a sentence that says what to change.

Nothing here executes submitted code: Python files are only parsed (``ast.parse``).
"""
import bz2
import gzip
import io
import lzma
import posixpath
import tarfile
import zipfile
import zlib
from dataclasses import dataclass

from django.conf import settings

from core.python_source import parse_python
from core.untrusted import UntrustedInputError, load_yaml, text_problem

from .models import STRATEGIES, OracleSymptom, ReproducerVersion

ARCHIVE_SUFFIXES = (".zip", ".tar.gz", ".tgz", ".tar")
ARCHIVE_READ_FACTOR = 4  # an archive may be at most this many times the unpacked limit (text compresses)
TAR_BYTES_PER_ENTRY = 4096  # a header, a pax or long-name header, padding: what a tar adds to each member
TAR_END_BYTES = 20 * 512  # the end-of-archive blocks and the padding of the last record
# What the runner itself makes in a run directory beside the reproducer's files (runners/execution.py: the
# private tmp and the report; runners/detectors/traincheck.py: its work folder, WORK_DIR; runners/compile_cache.py:
# RUN_CACHE_NAME, the copy of Inductor's cache; runners/detectors/base.py: DETECTOR_MODULE_FILE, a submitted
# detector's module): a file or folder of the reproducer with one of these names would clash with them.
RUN_DIRECTORY_NAMES = frozenset({"tmp", ".silentbench-report.jsonl", ".traincheck", ".compile-cache",
                                 ".silentbench-detector.py"})
# TrainCheck writes its instrumented copy of a script beside it, named with this prefix (runners/detectors/
# traincheck.py, INSTRUMENTED_PREFIX; not imported: runners imports bugs, never the other way round).
TRAINCHECK_COPY_PREFIX = "_traincheck_"
NAME_MAX_BYTES = 255  # the longest file or folder name Linux file systems take
MAX_STORED_INTEGER = 2**31 - 1  # the largest whole number an integer column holds on every database
MANIFEST_NAME = "reproducer.yaml"
ENTRYPOINT_MAX_LENGTH = ReproducerVersion._meta.get_field("entrypoint").max_length
REQUIRED_MANIFEST_FIELDS = ("entrypoint", "strategy", "default_steps", "needs")
# What the protocol asks every reproducer to say (docs/reproducer-protocol.md): any of the spellings, and why.
PROTOCOL_TOKENS = [
    (("SILENTBENCH_REPORT",), "write its reports to the file named by $SILENTBENCH_REPORT"),
    (("--variant",), "take --variant {buggy,fixed}"),
    (("--seed",), "take --seed N"),
    (("--steps",), "take --steps N"),
    (('"oracle"', "'oracle'"), 'write an {"event": "oracle", ...} record'),
    (("manifested",), "say in its oracle record whether the symptom manifested"),
    (("trigger_step",), "give the trigger step in its oracle record"),
]


@dataclass(frozen=True)
class SubmissionLimits:
    max_files: int
    max_file_bytes: int
    max_total_bytes: int

    @classmethod
    def from_settings(cls):
        return cls(settings.SILENTBENCH_SUBMISSION_MAX_FILES, settings.SILENTBENCH_SUBMISSION_MAX_FILE_BYTES,
                   settings.SILENTBENCH_SUBMISSION_MAX_TOTAL_BYTES)

    @property
    def max_entries(self):
        """Members of an archive, folders and links included: a folder for each file at most."""
        return 2 * self.max_files

    @property
    def max_unpacked_bytes(self):
        """A tar archive's uncompressed stream: the files, plus the headers and padding of every entry."""
        return self.max_total_bytes + TAR_BYTES_PER_ENTRY * self.max_entries + TAR_END_BYTES


def _kib(n):
    return f"{n / 1024:.0f} KiB"


def _too_big(name, size, limits):
    return f"{name}: {_kib(size)}, more than the {_kib(limits.max_file_bytes)} allowed per file."


def read_uploads(uploads, limits=None):
    """``{path: text}`` from uploaded files, or from the single archive among them, and the problems found.

    ``uploads`` are objects with ``.name``, ``.size`` and ``.read()`` (Django's UploadedFile).
    """
    limits = limits or SubmissionLimits.from_settings()
    uploads = list(uploads)
    if not uploads:
        return {}, ["No files: upload the reproducer's files (reproducer.yaml and its code), or one .zip/.tar.gz."]
    archives = [u for u in uploads if u.name.lower().endswith(ARCHIVE_SUFFIXES)]
    if archives:
        if len(uploads) > 1:
            return {}, ["Upload either one archive or loose files, not both."]
        return read_archive(archives[0], limits)
    if len(uploads) > limits.max_files:
        return {}, [f"{len(uploads)} files: at most {limits.max_files} are accepted."]
    files, problems = {}, []
    for upload in uploads:
        name = posixpath.basename(upload.name.replace("\\", "/"))
        if problem := path_problem(name):
            problems.append(problem)
        elif upload.size > limits.max_file_bytes:
            problems.append(_too_big(name, upload.size, limits))
        else:
            _add_text(files, problems, name, upload.read(limits.max_file_bytes + 1))
    _check_total(files, problems, limits)
    return files, problems


class ArchiveTooLarge(Exception):
    """A tar archive's uncompressed stream passed ``SubmissionLimits.max_unpacked_bytes``."""


class _Unpacked:
    """The uncompressed stream of a tar archive (plain, gzip, bzip2 or xz, told by its first bytes), read
    once, front to back, by tarfile's stream mode. Past ``budget`` bytes it raises ArchiveTooLarge: whatever
    the headers say (300,000 folders, a pax header of a gigabyte), no more than that is ever decompressed."""

    def __init__(self, data, budget):
        raw = io.BytesIO(data)
        if data.startswith(b"\x1f\x8b"):
            self.stream = gzip.GzipFile(fileobj=raw)
        elif data.startswith(b"BZh"):
            self.stream = bz2.BZ2File(raw)
        elif data.startswith(b"\xfd7zXZ\x00"):
            self.stream = lzma.LZMAFile(raw)
        else:
            self.stream = raw
        self.budget, self.given = budget, 0

    def read(self, size=-1):
        allowed = self.budget + 1 - self.given  # one byte more than the budget tells "too large" from "just fits"
        chunk = self.stream.read(allowed if size < 0 else min(size, allowed))
        self.given += len(chunk)
        if self.given > self.budget:
            raise ArchiveTooLarge
        return chunk


def read_archive(upload, limits):
    """Regular files of a .zip or a .tar (plain, .gz, .bz2 or .xz). Every entry counts, folders and links
    too, and reading stops at the first limit passed, so an archive costs at most what an accepted one does:
    a tar's stream is never decompressed past ``limits.max_unpacked_bytes``, nor a file past its limit."""
    if upload.size > ARCHIVE_READ_FACTOR * limits.max_total_bytes:
        return {}, [f"{upload.name}: {_kib(upload.size)} compressed; a reproducer unpacks to at most "
                    f"{_kib(limits.max_total_bytes)}."]
    data = upload.read()
    try:
        entries = _zip_entries(data, limits) if upload.name.lower().endswith(".zip") else _tar_entries(data, limits)
        members, problems = _read_entries(entries, limits)
    except ArchiveTooLarge:
        return {}, [f"{upload.name}: its tar stream is longer than {_kib(limits.max_unpacked_bytes)} (files, headers "
                    f"and folders together), more than a reproducer of {_kib(limits.max_total_bytes)} needs."]
    except (zipfile.BadZipFile, tarfile.TarError, EOFError, OSError, RuntimeError, NotImplementedError,
            zlib.error, lzma.LZMAError) as error:  # encrypted or unsupported members, corrupt streams
        return {}, [f"{upload.name}: not a readable archive ({error})."]
    if problems:
        return {}, problems
    return _archive_files(members, limits)


def _zip_entries(data, limits):
    """(name, kind, size, read) of each member: kind is file, dir or link; ``read()`` gives at most one file's
    limit and one byte."""
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        for info in archive.infolist():
            is_link = (info.external_attr >> 16) & 0o170000 == 0o120000
            kind = "dir" if info.is_dir() else "link" if is_link else "file"
            yield (info.filename, kind, info.file_size,
                   lambda info=info: archive.open(info).read(limits.max_file_bytes + 1))


def _tar_entries(data, limits):
    """Like ``_zip_entries``, in one pass over the stream: ``read()`` works until the next entry is taken."""
    with tarfile.open(fileobj=_Unpacked(data, limits.max_unpacked_bytes), mode="r|") as archive:
        for info in archive:
            kind = "dir" if info.isdir() else "file" if info.isfile() else "link"
            yield (info.name, kind, info.size,
                   lambda info=info: archive.extractfile(info).read(limits.max_file_bytes + 1))


def _read_entries(entries, limits):
    """[(name, kind, size, data)] of the entries, each regular file read if it is within its limit, or the
    problem with the whole archive: reading stops at the first entry past a limit."""
    members, count, files, total = [], 0, 0, 0
    for name, kind, size, read in entries:
        count += 1
        if count > limits.max_entries:
            return [], [f"The archive holds more than {limits.max_entries} entries (files and folders), the most "
                        "that are accepted."]
        if kind != "dir":
            files += 1
            total += size
        if files > limits.max_files:
            return [], [f"The archive holds more than {limits.max_files} files, the most that are accepted."]
        if total > limits.max_total_bytes:
            return [], [f"The archive unpacks to more than {_kib(limits.max_total_bytes)}, the limit for a reproducer."]
        members.append((name, kind, size, read() if kind == "file" and size <= limits.max_file_bytes else None))
    return members, []


def _archive_files(members, limits):
    """``{path: text}`` and the problems, paths relative to the archive's one top folder if it has one."""
    members = [(_without_dot_prefix(name).rstrip("/") if kind == "dir" else _without_dot_prefix(name), kind, size,
                data) for name, kind, size, data in members]
    prefix = _common_folder([name for name, kind, _, _ in members if kind != "dir"])
    files, problems = {}, []
    for name, kind, size, data in members:
        if kind == "dir" and (name in ("", ".") or name + "/" == prefix):
            continue  # the archive's root, or the reproducer's folder itself
        path = name[len(prefix):] if name.startswith(prefix) else name
        if problem := path_problem(path):
            problems.append(problem)
        elif kind == "link":
            problems.append(f"{path}: links and special files are not accepted, only regular files.")
        elif kind == "file" and size > limits.max_file_bytes:
            problems.append(_too_big(path, size, limits))
        elif kind == "file":
            _add_text(files, problems, path, data)
    _check_total(files, problems, limits)
    return files, problems


def _without_dot_prefix(name):
    """'repro.py' for './repro.py', as tar writes the members of ``tar -cf x.tar .``."""
    while name.startswith("./"):
        name = name[2:]
    return name


def _common_folder(names):
    """'repro/' when every member lives in one top folder (an archive of a folder), else ''."""
    tops = {name.split("/", 1)[0] for name in names}
    if len(tops) == 1 and all("/" in name for name in names):
        return tops.pop() + "/"
    return ""


def path_problem(path):
    """Why a file or folder of a reproducer may not be called ``path`` ('/' between folders), or ''."""
    parts = path.split("/")
    if text_problem(path) or any(ord(char) < 32 or ord(char) == 127 for char in path):
        return f"{ascii(path)}: control characters (such as NUL) and invalid UTF-8 are not accepted in file names."
    if path.startswith("/") or "\\" in path or any(part in ("", ".", "..") for part in parts):
        return f"{path}: paths must stay inside the reproducer's folder, with no '.', '..' or empty part."
    if any(len(part.encode()) > NAME_MAX_BYTES for part in parts):
        return f"{path[:80]}...: a name is longer than {NAME_MAX_BYTES} bytes."
    if parts[0] in RUN_DIRECTORY_NAMES:
        return (f"{path}: the runner makes its own {parts[0]} in the run directory (reserved: "
                f"{', '.join(sorted(RUN_DIRECTORY_NAMES))}); choose another name.")
    if any(part.startswith(TRAINCHECK_COPY_PREFIX) for part in parts):
        return (f"{path}: TrainCheck writes its copy of a script beside it as {TRAINCHECK_COPY_PREFIX}<name>; "
                f"choose a name that does not start with {TRAINCHECK_COPY_PREFIX}.")
    return ""


def _add_text(files, problems, name, data):
    if name in files:
        problems.append(f"{name}: given twice.")
        return
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        problems.append(f"{name}: not UTF-8 text; a reproducer is source code and a manifest, no binaries.")
        return
    if "\x00" in text:
        problems.append(f"{name}: holds NUL bytes, so it is not text; a reproducer is source code and a manifest, "
                        "no binaries.")
        return
    files[name] = text


def _check_total(files, problems, limits):
    total = sum(len(text.encode()) for text in files.values())
    if total > limits.max_total_bytes:
        problems.append(f"The files add up to {_kib(total)}, more than the {_kib(limits.max_total_bytes)} allowed.")


def manifest_problems(manifest, files, *, reproduces_bug=True):
    """What is wrong with a parsed reproducer.yaml, given the reproducer's files (shared with the catalog loader).
    Every number that is stored in a column must fit it, on every database. A bug's reproducer (every submission)
    must also declare its oracle's symptom and its fidelity note; a clean reference pipeline has neither."""
    if not isinstance(manifest, dict):
        return [f"{MANIFEST_NAME} must be a mapping of fields (see docs/reproducer-protocol.md)."]
    problems = [f"{MANIFEST_NAME}: '{name}' is not declared." for name in REQUIRED_MANIFEST_FIELDS
                if name not in manifest]
    if reproduces_bug:
        problems += fidelity_problems(manifest)
    if "historical_reason" in manifest and not _text(manifest["historical_reason"]):
        problems.append(f"{MANIFEST_NAME}: historical_reason must say in a sentence why no environment today can "
                        f"show the bug (e.g. only builds long gone had it).")
    if "strategy" in manifest and manifest["strategy"] not in STRATEGIES:
        problems.append(f"{MANIFEST_NAME}: strategy must be one of {', '.join(STRATEGIES)}.")
    entrypoint = manifest.get("entrypoint")
    if "entrypoint" in manifest and not (isinstance(entrypoint, str) and entrypoint in files):
        problems.append(f"{MANIFEST_NAME}: entrypoint {entrypoint!r} is not among the files.")
    elif isinstance(entrypoint, str) and len(entrypoint) > ENTRYPOINT_MAX_LENGTH:
        problems.append(f"{MANIFEST_NAME}: entrypoint is longer than {ENTRYPOINT_MAX_LENGTH} characters.")
    if "default_steps" in manifest and not _whole_number(manifest["default_steps"], 1, 100_000):
        problems.append(f"{MANIFEST_NAME}: default_steps must be a whole number from 1 to 100000.")
    needs = manifest.get("needs", {})
    if not isinstance(needs, dict):
        problems.append(f"{MANIFEST_NAME}: needs must be a mapping (cuda, gpus, world_size, time_limit_seconds, ...).")
        return problems
    for name in ("gpus", "world_size", "time_limit_seconds", "memory_mb", "open_files", "threads"):
        if name in needs and not _whole_number(needs[name], 0, MAX_STORED_INTEGER):
            problems.append(f"{MANIFEST_NAME}: needs.{name} must be a whole number from 0 to {MAX_STORED_INTEGER}.")
    if "cuda" in needs and not isinstance(needs["cuda"], bool):
        problems.append(f"{MANIFEST_NAME}: needs.cuda must be true or false.")
    memory = needs.get("gpu_memory_gb", 0)
    if isinstance(memory, bool) or not isinstance(memory, (int, float)) or not 0 <= memory <= 4096:
        problems.append(f"{MANIFEST_NAME}: needs.gpu_memory_gb must be a number of GB per GPU.")
    return problems


def fidelity_problems(manifest):
    """What a bug's reproducer.yaml lacks to say what its oracle judges and how far it is from the upstream report."""
    problems = []
    oracle = manifest.get("oracle")
    symptoms = ", ".join(OracleSymptom.values)
    if not isinstance(oracle, dict):
        problems.append(f"{MANIFEST_NAME}: 'oracle' must declare the symptom your oracle record judges, as a user of "
                        f"the faulty program would see it: 'oracle: {{symptom: <one of {symptoms}>, "
                        f"check: <what it compares, with the threshold>}}' (docs/reproducer-protocol.md).")
    else:
        if oracle.get("symptom") not in OracleSymptom.values:
            problems.append(f"{MANIFEST_NAME}: oracle.symptom must be one of {symptoms}: the symptom the oracle "
                            f"judges, not its cause (docs/reproducer-protocol.md).")
        if not _text(oracle.get("check")):
            problems.append(f"{MANIFEST_NAME}: oracle.check must say in a sentence what the oracle compares, with "
                            f"its threshold.")
    if not _text(manifest.get("fidelity_note")):
        problems.append(f"{MANIFEST_NAME}: 'fidelity_note' must say in a sentence or two what differs from the "
                        f"upstream report's setup (model, optimizer, loss, data, steps, hardware) and why, or that "
                        f"nothing does (docs/reproducer-protocol.md).")
    return problems


def _text(value):
    return isinstance(value, str) and bool(value.strip())


def _whole_number(value, minimum, maximum):
    return isinstance(value, int) and not isinstance(value, bool) and minimum <= value <= maximum


def reproducer_problems(files):
    """(manifest, problems) of a reproducer's files: manifest fields, Python syntax, protocol."""
    if MANIFEST_NAME not in files:
        return {}, [f"No {MANIFEST_NAME}: it declares the entrypoint, strategy, default steps, needs, the "
                    f"oracle's symptom and the fidelity note (docs/reproducer-protocol.md)."]
    try:
        manifest = load_yaml(files[MANIFEST_NAME], max_bytes=settings.SILENTBENCH_MAX_MANIFEST_BYTES)
    except UntrustedInputError as error:
        return {}, [f"{MANIFEST_NAME}: {error}"]
    problems = manifest_problems(manifest, files)
    if isinstance(manifest, dict) and "historical_reason" in manifest:
        problems.append(f"{MANIFEST_NAME}: historical_reason is for the catalog's own records of bugs no environment "
                        f"can show any more; a submitted reproducer is verified by running it, so leave it out.")
    sources = {path: text for path, text in files.items() if path.endswith(".py")}
    if not sources:
        problems.append("No Python file: a reproducer is a standalone PyTorch program.")
    problems += [problem for path, text in sorted(sources.items()) if (problem := parse_python(path, text)[1])]
    code = "\n".join(sources.values())
    problems += [f"The code never mentions {spellings[0]}: a reproducer must {what} (docs/reproducer-protocol.md)."
                 for spellings, what in PROTOCOL_TOKENS if sources and not any(s in code for s in spellings)]
    return (manifest if isinstance(manifest, dict) else {}), problems


def check_uploads(uploads):
    """Every problem of uploaded files at once: ``(files, checked, problems)``. ``checked`` is
    ``reproducer_problems(files)`` (hand it to ``do_submit_reproducer`` so the code is parsed once) when the files
    could be read, else None: a file left out for a limit would make the manifest's checks report it missing."""
    files, problems = read_uploads(uploads)
    checked = None
    if files and not problems:
        checked = reproducer_problems(files)
        problems = checked[1]
    return files, checked, problems
