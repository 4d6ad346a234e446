"""Reading and checking a submitted reproducer before anything is stored: files or one archive in,
every problem out at once, each in a sentence that says what to change.

Nothing here executes submitted code: Python files are only parsed (``ast.parse``).
"""
import ast
import io
import lzma
import posixpath
import tarfile
import zipfile
import zlib
from dataclasses import dataclass

import yaml
from django.conf import settings

from .models import Strategy

ARCHIVE_SUFFIXES = (".zip", ".tar.gz", ".tgz", ".tar")
ARCHIVE_READ_FACTOR = 4  # an archive may be at most this many times the unpacked limit (text compresses)
MANIFEST_NAME = "reproducer.yaml"
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
        if upload.size > limits.max_file_bytes:
            problems.append(_too_big(name, upload.size, limits))
            continue
        _add_text(files, problems, name, upload.read(limits.max_file_bytes + 1))
    _check_total(files, problems, limits)
    return files, problems


def read_archive(upload, limits):
    """Regular files of a .zip or .tar(.gz). Members are read one at a time and reading stops as soon as a
    limit is passed, so an archive of millions of empty entries costs no more than one over the limit."""
    if upload.size > ARCHIVE_READ_FACTOR * limits.max_total_bytes:
        return {}, [f"{upload.name}: {_kib(upload.size)} compressed; a reproducer unpacks to at most "
                    f"{_kib(limits.max_total_bytes)}."]
    data = upload.read()
    cap = limits.max_file_bytes + 1  # never decompress more than one file's limit
    members = []
    try:
        if upload.name.lower().endswith(".zip"):
            with zipfile.ZipFile(io.BytesIO(data)) as archive:
                for info in archive.infolist():
                    if not info.is_dir():
                        is_link = (info.external_attr >> 16) & 0o170000 == 0o120000
                        members.append((info.filename, info.file_size, is_link,
                                        lambda info=info, archive=archive: archive.open(info).read(cap)))
                    if _over_limits(members, limits):
                        break
                return _read_members(members, limits)
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as archive:
            for info in archive:  # lazily: getmembers() would read every header first
                if not info.isdir():
                    members.append((info.name, info.size, not info.isfile(),
                                    lambda info=info, archive=archive: archive.extractfile(info).read(cap)))
                if _over_limits(members, limits):
                    break
            return _read_members(members, limits)
    except (zipfile.BadZipFile, tarfile.TarError, EOFError, OSError, RuntimeError, NotImplementedError,
            zlib.error, lzma.LZMAError) as error:  # encrypted or unsupported members, corrupt streams
        return {}, [f"{upload.name}: not a readable archive ({error})."]


def _over_limits(members, limits):
    return len(members) > limits.max_files or sum(size for _, size, _, _ in members) > limits.max_total_bytes


def _read_members(members, limits):
    files, problems = {}, []
    if len(members) > limits.max_files:
        return {}, [f"The archive holds more than {limits.max_files} files, the most that are accepted."]
    if sum(size for _, size, _, _ in members) > limits.max_total_bytes:
        return {}, [f"The archive unpacks to more than {_kib(limits.max_total_bytes)}, the limit for a reproducer."]
    prefix = _common_folder([name for name, _, _, _ in members])
    for name, size, is_link, read in members:
        path = posixpath.normpath(name[len(prefix):])
        if name.startswith("/") or path.startswith("..") or "\\" in name:
            problems.append(f"{name}: paths must stay inside the reproducer's folder.")
        elif is_link:
            problems.append(f"{name}: links and special files are not accepted, only regular files.")
        elif size > limits.max_file_bytes:
            problems.append(_too_big(path, size, limits))
        else:
            _add_text(files, problems, path, read())
    _check_total(files, problems, limits)
    return files, problems


def _common_folder(names):
    """'repro/' when every member lives in one top folder (an archive of a folder), else ''."""
    tops = {name.split("/", 1)[0] for name in names}
    if len(tops) == 1 and all("/" in name for name in names):
        return tops.pop() + "/"
    return ""


def _add_text(files, problems, name, data):
    if name in files:
        problems.append(f"{name}: given twice.")
        return
    try:
        files[name] = data.decode("utf-8")
    except UnicodeDecodeError:
        problems.append(f"{name}: not UTF-8 text; a reproducer is source code and a manifest, no binaries.")


def _check_total(files, problems, limits):
    total = sum(len(text.encode()) for text in files.values())
    if total > limits.max_total_bytes:
        problems.append(f"The files add up to {_kib(total)}, more than the {_kib(limits.max_total_bytes)} allowed.")


def manifest_problems(manifest, files):
    """What is wrong with a parsed reproducer.yaml, given the reproducer's files (shared with the catalog loader)."""
    if not isinstance(manifest, dict):
        return [f"{MANIFEST_NAME} must be a mapping of fields (see docs/reproducer-protocol.md)."]
    problems = [f"{MANIFEST_NAME}: '{name}' is not declared." for name in REQUIRED_MANIFEST_FIELDS
                if name not in manifest]
    if "strategy" in manifest and manifest["strategy"] not in Strategy.values:
        problems.append(f"{MANIFEST_NAME}: strategy must be one of {', '.join(Strategy.values)}.")
    if "entrypoint" in manifest and manifest["entrypoint"] not in files:
        problems.append(f"{MANIFEST_NAME}: entrypoint {manifest['entrypoint']!r} is not among the files.")
    if "default_steps" in manifest and not (isinstance(manifest["default_steps"], int)
                                            and 1 <= manifest["default_steps"] <= 100_000):
        problems.append(f"{MANIFEST_NAME}: default_steps must be a whole number from 1 to 100000.")
    needs = manifest.get("needs", {})
    if not isinstance(needs, dict):
        problems.append(f"{MANIFEST_NAME}: needs must be a mapping (cuda, gpus, world_size, time_limit_seconds, ...).")
        return problems
    for name in ("gpus", "world_size", "time_limit_seconds", "memory_mb"):
        if name in needs and not (isinstance(needs[name], int) and needs[name] >= 0):
            problems.append(f"{MANIFEST_NAME}: needs.{name} must be a whole number.")
    if "cuda" in needs and not isinstance(needs["cuda"], bool):
        problems.append(f"{MANIFEST_NAME}: needs.cuda must be true or false.")
    memory = needs.get("gpu_memory_gb", 0)
    if isinstance(memory, bool) or not isinstance(memory, (int, float)) or not 0 <= memory <= 4096:
        problems.append(f"{MANIFEST_NAME}: needs.gpu_memory_gb must be a number of GB per GPU.")
    return problems


def reproducer_problems(files):
    """(manifest, problems) of a reproducer's files: manifest fields, Python syntax, protocol."""
    if MANIFEST_NAME not in files:
        return {}, [f"No {MANIFEST_NAME}: it declares the entrypoint, strategy, default steps and needs "
                    f"(docs/reproducer-protocol.md)."]
    try:
        manifest = yaml.safe_load(files[MANIFEST_NAME])
    except yaml.YAMLError as error:
        return {}, [f"{MANIFEST_NAME} is not valid YAML: {error}"]
    problems = manifest_problems(manifest, files)
    sources = {path: text for path, text in files.items() if path.endswith(".py")}
    if not sources:
        problems.append("No Python file: a reproducer is a standalone PyTorch program.")
    for path, text in sorted(sources.items()):
        try:
            ast.parse(text, filename=path)
        except SyntaxError as error:
            problems.append(f"{path}, line {error.lineno}: {error.msg} (the code does not parse).")
    code = "\n".join(sources.values())
    problems += [f"The code never mentions {spellings[0]}: a reproducer must {what} (docs/reproducer-protocol.md)."
                 for spellings, what in PROTOCOL_TOKENS if sources and not any(s in code for s in spellings)]
    return (manifest if isinstance(manifest, dict) else {}), problems
