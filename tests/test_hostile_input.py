"""Hostile input through the real entry points (the test client, real YAML and archives built here): each case
is a 400 (or a 404) whose message names the problem, nothing is stored, and reading it costs no more than an
accepted reproducer does. bin/test runs this file on SQLite and on PostgreSQL, where NUL, NaN and integers
past 2**31 are what the database itself refuses.
"""
import io
import lzma
import tarfile
import zipfile

import pytest
import yaml
from django.core.exceptions import ValidationError
from django.core.files.uploadedfile import SimpleUploadedFile

from bugs.catalog import do_load_catalog
from bugs.models import Bug, ReproducerVersion
from bugs.submissions import RUN_DIRECTORY_NAMES
from runners.detectors.traincheck import INSTRUMENTED_PREFIX, WORK_DIR
from runners.execution import execute
from runners.models import Campaign, Run

from .factories import PROGRAM_PREAMBLE, MaintainerFactory, ReproducerVersionFactory, RunFactory, UserFactory
from .helpers import BUG_FORM, FILES, SUBMISSION_MANIFEST, client_for, uploads

pytestmark = pytest.mark.django_db

FIELDS = {name: value for name, value in BUG_FORM.items() if name != "reproducer_name"}
MANIFEST = yaml.safe_dump(SUBMISSION_MANIFEST)
APPENDED_LINE = "line %d" % (MANIFEST.count("\n") + 1)  # where a line added to MANIFEST is
# The "billion laughs": 1.2 KB that expand to 9**9 strings, stored as a 17.5 MB manifest before this check.
ALIAS_BOMB = MANIFEST + 'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n' + "".join(
    f"{name}: &{name} [{', '.join([f'*{previous}'] * 9)}]\n" for previous, name in zip("abcdefgh", "bcdefghi"))


def submit(files):
    """POST /api/submissions/ as a contributor, with these uploads."""
    return client_for(UserFactory()).post("/api/submissions/", {**FIELDS, "files": files})


def assert_refused(response, *words):
    """A 400 naming the problem in these words, and nothing stored."""
    assert response.status_code == 400, response.content
    problems = " ".join(response.json()["files"])
    assert all(word in problems for word in words), problems
    assert ReproducerVersion.objects.count() == 0 and Bug.objects.count() == 0


def with_manifest(text):
    return uploads({**FILES, "reproducer.yaml": text})


def tar_upload(members, name="repro.tar.gz", mode="w:gz"):
    """An archive of ``[(TarInfo, bytes)]`` plus the valid reproducer's files in the same folder."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode=mode, format=tarfile.PAX_FORMAT) as out:
        for path, text in FILES.items():
            info = tarfile.TarInfo(f"my-repro/{path}")
            info.size = len(text.encode())
            out.addfile(info, io.BytesIO(text.encode()))
        for info, data in members:
            info.size = len(data)
            out.addfile(info, io.BytesIO(data))
    return SimpleUploadedFile(name, buffer.getvalue())


def tar_file(name, data=b"print(1)\n", **pax):
    info = tarfile.TarInfo(name)
    info.pax_headers = pax
    return info, data


# --- reproducer.yaml ------------------------------------------------------------------------------------

def test_a_yaml_alias_bomb_is_refused_before_it_expands(client):
    assert len(ALIAS_BOMB) - len(MANIFEST) < 1300
    assert_refused(submit(with_manifest(ALIAS_BOMB)), "reproducer.yaml: line ", "aliases (*a) are not accepted")
    client.force_login(UserFactory())
    page = client.post("/submit/", {**BUG_FORM, "files": with_manifest(ALIAS_BOMB)})
    assert page.status_code == 200 and "aliases (*a) are not accepted" in page.content.decode()
    assert ReproducerVersion.objects.count() == 0


@pytest.mark.parametrize("text, words", [
    (MANIFEST + "notes: " + "x" * 16 * 1024 + "\n", ["more than the 16384 accepted"]),
    (MANIFEST + "deep: " + "[" * 5000 + "]" * 5000 + "\n", ["nested more than 20 levels deep"]),
    (MANIFEST + "deep: " + "[" * 25 + "]" * 25 + "\n", ["nested more than 20 levels deep"]),
    (MANIFEST.replace("memory_mb: 1024", "memory_mb: 99999999999"),
     ["needs.memory_mb must be a whole number from 0 to 2147483647"]),
    (MANIFEST.replace("world_size: 1", "world_size: -1"), ["needs.world_size must be a whole number from 0"]),
    (MANIFEST.replace("default_steps: 4", "default_steps: 99999999999"), ["default_steps must be"]),
    (MANIFEST.replace("cuda: false", "cuda: false\n  gpus: true"), ["needs.gpus must be a whole number"]),
    (MANIFEST + "seed: " + "9" * 5000 + "\n", [f"{APPENDED_LINE}: a number with 5000 characters is too long"]),
    (MANIFEST + "seed: 0x" + "f" * 3700 + "\n", [f"{APPENDED_LINE}: a number with 3702 characters is too long"]),
    (MANIFEST + "seed: " + "1:" * 3000 + "1\n", ["a number with 6001 characters is too long"]),
    (MANIFEST + "seed: 0x8000000000000000\n", ["seed: 9223372036854775808 is outside what a 64-bit integer"]),
    (MANIFEST + "seed: -0x8000000000000001\n", ["seed: -9223372036854775809 is outside"]),
    (MANIFEST + "seed: 0x" + "f" * 90 + "\n", ["seed: a 360-bit number is outside what a 64-bit integer"]),
    (MANIFEST + "? 0x" + "f" * 90 + "\n: x\n", ["the key a 360-bit number is not text"]),
    (MANIFEST + "x: !!float abc\n", [f"{APPENDED_LINE}: !!float 'abc' is not a number."]),
    (MANIFEST + "x: !!float .\n", ["!!float '.' is not a number."]),
    (MANIFEST + "x: !!float 1:a\n", ["!!float '1:a' is not a number."]),
    (MANIFEST + "x: !!bool maybe\n", [f"{APPENDED_LINE}: !!bool 'maybe' is not true or false."]),
    (MANIFEST + 'x: !!int ""\n', ["!!int '' is not a whole number."]),
    (MANIFEST + "x: !!int abc\n", ["!!int 'abc' is not a whole number."]),
    (MANIFEST + "x: !!int 0b\n", ["!!int '0b' is not a whole number."]),
    (MANIFEST + "x: !<tag:yaml.org,2002:int> 0o8\n", ["!!int '0o8' is not a whole number."]),
    (MANIFEST + "x: !!str [a]\n", ["expected a scalar node, but found sequence"]),
    (MANIFEST + "x: !!null {a: 1}\n", ["expected a scalar node, but found mapping"]),
    (MANIFEST + "x: !!map 1\n", ["expected a mapping node, but found scalar"]),
    (MANIFEST + "x: !!float " + "1" * 400 + "e9\n", ["x: inf is not a finite number"]),
    (MANIFEST + 'x: "\\U00110000"\n', [f"{APPENDED_LINE}: chr() arg not in range(0x110000)"]),
    (MANIFEST + 'x: "\\UFFFFFFFF"\n', [f"not valid YAML: {APPENDED_LINE}:"]),
    (MANIFEST + "x: a\x1bb\n", ["not valid YAML:", "special characters are not allowed"]),
    (MANIFEST + "x: a\x7fb\n", ["not valid YAML:", "special characters are not allowed"]),
    (MANIFEST + "x: a\x01b\n", ["not valid YAML:", "special characters are not allowed"]),
    (MANIFEST + "x: a\ufffeb\n", ["not valid YAML:", "special characters are not allowed"]),
    ("%YAML 1." + "1" * 5000 + "\n---\n" + MANIFEST, ["line 1: Exceeds the limit (4300 digits)"]),
    (MANIFEST + "x: !!timestamp 2024-01-31\n", ["could not determine a constructor", "timestamp"]),
    (MANIFEST + "x: !!timestamp 2024-13-45\n", ["could not determine a constructor", "timestamp"]),
    (MANIFEST + "x: !!omap [a: 1, b: 2]\n", ["could not determine a constructor", "omap"]),
    (MANIFEST + "x: !!pairs [a: 1, a: 2]\n", ["could not determine a constructor", "pairs"]),
    (MANIFEST + "x: !!set {a, b}\n", ["could not determine a constructor", "set"]),
    (MANIFEST + "x: !!merge {a: 1}\n", ["could not determine a constructor", "merge"]),
    (MANIFEST + 'x: !!python/object/apply:os.system ["true"]\n', ["could not determine a constructor",
                                                                  "python/object/apply:os.system"]),
    (MANIFEST + "x: !!python/name:os.system ''\n", ["could not determine a constructor", "python/name"]),
    (MANIFEST + "x: !custom 1\n", ["could not determine a constructor for the tag '!custom'"]),
    (MANIFEST + "loss: .nan\n", ["loss: nan is not a finite number"]),
    (MANIFEST + 'note: "a\\0b"\n', ["note: the text contains a NUL character"]),
    (MANIFEST + 'note: "\\ud800"\n', ["note: the text contains a lone surrogate"]),
    (MANIFEST + "blob: !!binary aGVsbG8=\n", ["could not determine a constructor", "binary"]),
    (MANIFEST + "on: 1\n", ["the key True is not text"]),
    (MANIFEST.replace("entrypoint: repro.py", "entrypoint: [repro.py]"), ["entrypoint ['repro.py'] is not among"]),
])
def test_a_manifest_that_would_cost_or_break_something_is_a_400_naming_it(text, words):
    assert_refused(submit(with_manifest(text)), *words)


def test_explicit_tags_with_values_of_their_type_are_stored():
    response = submit(with_manifest(MANIFEST + "a: !!int 0x10\nb: !!float '1.5'\nc: !!bool yes\nd: !!str 12\n"
                                    "e: !!null ''\nlow: -9223372036854775808\nhigh: 0x7fffffffffffffff\n"))
    assert response.status_code == 201, response.content
    manifest = ReproducerVersion.objects.get().manifest
    assert [manifest[key] for key in "abcde"] == [16, 1.5, True, "12", None]
    assert (manifest["low"], manifest["high"]) == (-2**63, 2**63 - 1)


def test_a_badly_tagged_value_is_a_problem_of_the_web_form_too(client):
    client.force_login(UserFactory())
    page = client.post("/submit/", {**BUG_FORM, "files": with_manifest(MANIFEST + "x: !!bool maybe\n")})
    assert page.status_code == 200 and "!!bool &#x27;maybe&#x27; is not true or false" in page.content.decode()
    assert ReproducerVersion.objects.count() == 0


def test_dates_in_a_manifest_stay_text_and_are_stored():
    response = submit(with_manifest(MANIFEST + "reported: 2024-01-31\nbroken_date: 2024-13-45\n"))
    assert response.status_code == 201, response.content
    manifest = ReproducerVersion.objects.get().manifest
    assert (manifest["reported"], manifest["broken_date"]) == ("2024-01-31", "2024-13-45")


def test_python_nested_past_the_parser_s_stack_is_a_400():
    assert_refused(submit(uploads({**FILES, "deep.py": "x = " + "-" * 100_000 + "1\n"})),
                   "deep.py: nested too deeply for Python's parser")
    assert_refused(submit(uploads({**FILES, "deep.py": "x = " + "1 + " * 10_000 + "1\n"})),
                   "deep.py: nested too deeply for Python's parser")


def test_a_file_with_nul_bytes_is_not_text():
    assert_refused(submit(uploads({**FILES, "notes.py": "# a\x00b\n"})), "notes.py: holds NUL bytes")


@pytest.mark.parametrize("text, words", [
    ("id: GH-1\ntitle: &t A title\nsymptom: *t\n", r"line 3: aliases \(\*t\) are not accepted"),
    ("id: GH-1\nmulti_rank: !!bool maybe\n", r"line 2: !!bool 'maybe' is not true or false"),
    ("id: GH-1\ntitle: !!float abc\n", r"line 2: !!float 'abc' is not a number"),
    ("id: GH-1\nsource: 0x" + "f" * 3700 + "\n", r"line 2: a number with 3702 characters is too long"),
    ("id: GH-1\nsource: 0x" + "f" * 20 + "\n", r"source: 1208925819614629174706175 is outside"),
])
def test_the_catalog_loader_reads_yaml_the_same_way(tmp_path, text, words):
    folder = tmp_path / "GH-1"
    folder.mkdir()
    (folder / "bug.yaml").write_text(text)
    with pytest.raises(ValidationError, match=r"bug\.yaml: cannot read YAML \(" + words):
        do_load_catalog(tmp_path)
    assert Bug.objects.count() == 0


# --- archives -------------------------------------------------------------------------------------------

def test_an_xz_archive_of_300000_folders_named_tar_is_refused_at_once():
    folder = tarfile.TarInfo("folder")
    folder.type = tarfile.DIRTYPE
    stream = folder.tobuf(tarfile.USTAR_FORMAT) * 300_000 + b"\0" * 10240
    data = lzma.compress(stream, preset=0)
    assert len(data) < 400_000
    assert_refused(submit([SimpleUploadedFile("repro.tar", data)]),
                   "The archive holds more than 40 entries (files and folders)")


def test_folders_count_as_entries_in_a_zip_too():
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as out:
        for index in range(41):
            out.writestr(f"my-repro/folder{index}/", "")
        for path, text in FILES.items():
            out.writestr(f"my-repro/{path}", text)
    assert_refused(submit([SimpleUploadedFile("repro.zip", buffer.getvalue())]),
                   "The archive holds more than 40 entries (files and folders)")


def test_a_header_that_claims_a_gigabyte_is_never_decompressed():
    """One pax header of 64 MiB (tarfile would read all of it into memory to parse it): the stream stops at the
    unpacked limit."""
    header = tarfile.TarInfo("././@PaxHeader")
    header.type = tarfile.XHDTYPE
    header.size = 64 * 1024 * 1024
    stream = header.tobuf(tarfile.USTAR_FORMAT) + b"9" * header.size
    data = lzma.compress(stream, preset=0)
    assert_refused(submit([SimpleUploadedFile("repro.tar.xz.tar", data)]), "its tar stream is longer than 1194 KiB")


@pytest.mark.parametrize("member, words", [
    (tar_file("my-repro/a/.."), ["a/..: paths must stay inside the reproducer's folder"]),
    (tar_file("my-repro/sub/./x.py"), ["sub/./x.py: paths must stay inside"]),
    (tar_file("my-repro/tmp"), ["tmp: the runner makes its own tmp in the run directory"]),
    (tar_file("my-repro/tmp/x.py"), ["tmp/x.py: the runner makes its own tmp"]),
    (tar_file("my-repro/.silentbench-report.jsonl", b"{}\n"), [".silentbench-report.jsonl: the runner makes"]),
    (tar_file(f"my-repro/{WORK_DIR}/invariants.json", b"{}\n"), [f"{WORK_DIR}/invariants.json: the runner"]),
    (tar_file(f"my-repro/{INSTRUMENTED_PREFIX}repro.py"), [f"{INSTRUMENTED_PREFIX}repro.py: TrainCheck writes"]),
    (tar_file(f"my-repro/src/{INSTRUMENTED_PREFIX}train.py"), [f"src/{INSTRUMENTED_PREFIX}train.py: TrainCheck"]),
    (tar_file("my-repro/x.py", path="my-repro/a\x00b.py"), ["'a\\x00b.py': control characters (such as NUL)"]),
    (tar_file("my-repro/x.py", path="my-repro/line\nbreak.py"), ["control characters"]),
    (tar_file("my-repro/" + "x" * 256 + ".py"), ["a name is longer than 255 bytes"]),
])
def test_member_names_that_would_break_the_run_are_refused(member, words):
    assert_refused(submit([tar_upload([member])]), *words)


def test_an_undecodable_member_name_is_refused():
    info = tarfile.TarInfo("my-repro/caf\udce9.py")  # the byte 0xe9 alone: not UTF-8
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.GNU_FORMAT, encoding="utf-8",
                      errors="surrogateescape") as out:
        for path, text in {**FILES, "caf\udce9.py": "print(1)\n"}.items():
            info = tarfile.TarInfo(f"my-repro/{path}")
            info.size = len(text.encode())
            out.addfile(info, io.BytesIO(text.encode()))
    assert_refused(submit([SimpleUploadedFile("repro.tar", buffer.getvalue())]), "invalid UTF-8")


@pytest.mark.parametrize("name", ["a/..", "tmp"])
def test_the_same_names_are_refused_in_a_zip(name):
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as out:
        for path, text in {**FILES, name: "x"}.items():
            out.writestr(f"my-repro/{path}", text)
    assert_refused(submit([SimpleUploadedFile("repro.zip", buffer.getvalue())]), f"{name}: ")


def test_loose_files_named_like_the_runner_s_own_are_refused():
    assert_refused(submit(uploads({**FILES, ".silentbench-report.jsonl": "{}"})), "the runner makes its own")
    assert_refused(submit(uploads({**FILES, f"{INSTRUMENTED_PREFIX}repro.py": "print(1)\n"})),
                   f"TrainCheck writes its copy of a script beside it as {INSTRUMENTED_PREFIX}<name>")


def test_names_like_the_runner_s_but_not_its_own_are_accepted():
    """TrainCheck once ran a script it wrote as .traincheck-run.sh; it writes none now, so the name is free."""
    response = submit(uploads({**FILES, ".traincheck-run.sh": "true\n", "traincheck_notes.py": "X = 1\n"}))
    assert response.status_code == 201, response.content


def test_an_archive_made_with_tar_dot_is_still_accepted():
    """``tar -czf repro.tar.gz .`` names the members ./repro.py and its root ./: those are not '.' parts."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:bz2") as out:
        root = tarfile.TarInfo(".")
        root.type = tarfile.DIRTYPE
        out.addfile(root)
        for path, text in {**FILES, "lib/util.py": "X = 1\n"}.items():
            info = tarfile.TarInfo(f"./{path}")
            info.size = len(text.encode())
            out.addfile(info, io.BytesIO(text.encode()))
    response = submit([SimpleUploadedFile("repro.tar.bz2.tar", buffer.getvalue())])
    assert response.status_code == 201, response.content
    assert sorted(ReproducerVersion.objects.get().files) == ["lib/util.py", "repro.py", "reproducer.yaml"]


@pytest.mark.integration
def test_the_reserved_names_are_all_the_runner_adds_to_a_run_directory():
    """A real run lists its directory: besides the reproducer's files there is only what RUN_DIRECTORY_NAMES
    reserves (what TrainCheck writes, its WORK_DIR and its copy of the entrypoint, is refused by
    test_member_names_that_would_break_the_run_are_refused)."""
    listing = PROGRAM_PREAMBLE + """
report(event="oracle", manifested=False, trigger_step=0, summary="listing", evidence={"entries": os.listdir(".")})
"""
    version = ReproducerVersionFactory(files={"repro.py": listing})
    outcome = execute(RunFactory(reproducer_version=version))
    assert outcome.succeeded, outcome.failure_reason
    added = set(outcome.oracle["evidence"]["entries"]) - {"repro.py"}
    assert "tmp" in added and added <= RUN_DIRECTORY_NAMES


# --- no 500, whatever the request -----------------------------------------------------------------------

@pytest.mark.parametrize("url, status", [
    ("/bugs/%00/", 400),
    ("/bugs/GH-1%00/submit/", 400),
    ("/catalog/?q=%00", 400),
    ("/catalog/?q=ok&framework=%00pytorch", 400),
    ("/results/?bugs=%00", 400),
    ("/api/bugs/?q=%00", 400),
    ("/api/bugs/%00/", 400),
    ("/runs/99999999999999999999/", 404),
    ("/api/runs/99999999999999999999/", 404),
    ("/api/reproducer-versions/99999999999999999999/", 404),
    ("/api/bugs/?page=99999999999999999999", 404),
])
def test_nul_and_numbers_out_of_range_in_a_url_are_a_400_or_404(client, url, status):
    response = client.get(url)
    assert response.status_code == status
    if status == 400:
        assert "contains a NUL character (%00)" in response.content.decode()


def test_nul_in_a_cookie_or_a_form_field_is_a_400(client):
    response = client.post("/accounts/login/", {"username": "alice\x00", "password": "x"})
    assert response.status_code == 400 and "form field 'username'" in response.content.decode()
    client.cookies["sessionid"] = "abcdefgh\x00ijkl"
    response = client.get("/")
    assert response.status_code == 400 and "cookie 'sessionid'" in response.content.decode()


@pytest.mark.parametrize("body, words", [
    ("[" * 100_000 + "]" * 100_000, "nested more than 20 levels deep"),
    ('{"name": "x", "deep": ' + "[" * 21 + "]" * 21 + "}", "nested more than 20 levels deep"),
    ('{"name": "laptop", "extra": {"note": "a\\u0000b"}}', "extra.note: the text contains a NUL character"),
    ('{"name": "\\ud800"}', "name: the text contains a lone surrogate"),
    ('{"name": "x", "extra": {"n": 9223372036854775808}}', "extra.n: 9223372036854775808 is outside what a 64-bit"),
    ('{"name": "x", "extra": [-9223372036854775809]}', "extra.0: -9223372036854775809 is outside"),
    ('{"name": "x", "extra": ' + "9" * 4000 + "}", "extra: a 13288-bit number is outside what a 64-bit"),
])
def test_a_json_body_nested_deeply_or_holding_nul_is_a_400(client, body, words):
    client.force_login(UserFactory())
    response = client.post("/api/tokens/", body, content_type="application/json")
    assert response.status_code == 400 and words in response.json()["detail"]


def test_a_maintainer_s_json_with_nul_is_refused_before_any_query(client):
    client.force_login(MaintainerFactory())
    response = client.post("/api/campaigns/preview/", {"bugs": ["GH-\x00"], "detectors": ["plain"]},
                           content_type="application/json")
    assert response.status_code == 400 and "bugs.0: the text contains a NUL character" in response.json()["detail"]


def test_a_seed_past_any_column_is_a_problem_of_the_campaign_form(client):
    """The builder's seeds are text ("0-2, 7"): a seed of 20 digits was a 500 on PostgreSQL once confirmed."""
    version = ReproducerVersionFactory()
    client.force_login(MaintainerFactory())
    page = client.post("/campaigns/new/", {"name": "big", "bugs": [version.reproducer.bug.bug_id],
                                           "detectors": ["plain"], "variants": ["buggy"],
                                           "seeds": "99999999999999999999"})
    assert page.status_code == 200 and "each from 0 to 1000000" in page.content.decode()
    assert Campaign.objects.count() == 0 and Run.objects.count() == 0


@pytest.mark.parametrize("url", ["/api/token/", "/api/submissions/", "/accounts/login/"])
@pytest.mark.parametrize("content_type, words", [
    ("multipart/form-data", "Invalid boundary in multipart: None"),
    ("application/x-www-form-urlencoded; charset=latin-1", "must be UTF-8 encoded"),
])
def test_a_form_that_cannot_be_parsed_is_a_400_naming_it(client, caplog, url, content_type, words):
    """Not Django's HTML 400 with a traceback in the log: a 400 that says why, JSON on the API, and one line."""
    response = client.post(url, b"abc", content_type=content_type)
    assert response.status_code == 400
    text = response.json()["detail"] if url.startswith("/api/") else response.content.decode()
    assert text.startswith("The request's form cannot be read: ") and words in text, text
    assert not [record for record in caplog.records if record.exc_info]
