"""Submitting a bug with its reproducer, the review queue, and verification on approval.

Nothing submitted runs before a maintainer approves that exact version: these tests count runs
and queued tasks at every step.
"""
import io
import tarfile
import zipfile

import pytest
import yaml
from django.core.files.uploadedfile import SimpleUploadedFile

from bugs.actions import do_review_version, do_submit_reproducer
from bugs.models import Bug, BugStatus, ReproducerVersion
from bugs.submissions import SubmissionLimits, read_uploads, reproducer_problems
from core.enums import ReviewState
from runners.actions.campaigns import do_complete_campaign
from runners.models import Campaign, CampaignPurpose, Run, RunStatus, StabilityCheck

from .factories import GOOD_REPRODUCER, BugFactory, MaintainerFactory, UserFactory
from .helpers import BUG_FORM, FILES, HOSTILE, SUBMISSION_MANIFEST, client_for, uploads

pytestmark = pytest.mark.django_db


def archive(files, kind="zip", prefix="my-repro/"):
    buffer = io.BytesIO()
    if kind == "zip":
        with zipfile.ZipFile(buffer, "w") as out:
            for name, text in files.items():
                out.writestr(prefix + name, text)
        return SimpleUploadedFile("repro.zip", buffer.getvalue())
    with tarfile.open(fileobj=buffer, mode="w:gz") as out:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(prefix + name)
            info.size = len(data)
            out.addfile(info, io.BytesIO(data))
    return SimpleUploadedFile("repro.tar.gz", buffer.getvalue())


# --- reading and checking files ---------------------------------------------------------------

@pytest.mark.parametrize("kind", ["zip", "tar"])
def test_an_archive_of_a_folder_reads_like_loose_files(kind):
    files, problems = read_uploads([archive(FILES, kind)])
    assert problems == [] and files == FILES
    assert read_uploads(uploads(FILES)) == (FILES, [])


def test_limits_hold_and_say_which_limit():
    limits = SubmissionLimits(max_files=3, max_file_bytes=1000, max_total_bytes=1500)
    _, problems = read_uploads(uploads({f"f{i}.py": "x" for i in range(4)}), limits)
    assert problems == ["4 files: at most 3 are accepted."]
    _, problems = read_uploads(uploads({"big.py": "x" * 2000}), limits)
    assert problems == ["big.py: 2 KiB, more than the 1 KiB allowed per file."]
    _, problems = read_uploads(uploads({"a.py": "x" * 900, "b.py": "y" * 900}), limits)
    assert "more than the 1 KiB allowed" in problems[0] and "add up to" in problems[0]
    _, problems = read_uploads([archive({"a.py": "x" * 900, "b.py": "y" * 900})], limits)
    assert problems == ["The archive unpacks to more than 1 KiB, the limit for a reproducer."]


def test_archives_cannot_escape_the_folder_or_smuggle_binaries():
    _, problems = read_uploads([archive({"../evil.py": "x", "ok.py": "y"}, prefix="")])
    assert problems == ["../evil.py: paths must stay inside the reproducer's folder, with no '.', '..' or empty part."]
    _, problems = read_uploads([SimpleUploadedFile("model.bin", b"\xff\xfe\x00")])
    assert problems == ["model.bin: not UTF-8 text; a reproducer is source code and a manifest, no binaries."]
    _, problems = read_uploads([SimpleUploadedFile("broken.zip", b"PK not really")])
    assert problems[0].startswith("broken.zip: not a readable archive")
    _, problems = read_uploads([archive(FILES), *uploads(FILES)])
    assert problems == ["Upload either one archive or loose files, not both."]


def test_every_problem_of_the_code_is_named_at_once():
    manifest, problems = reproducer_problems({
        "reproducer.yaml": yaml.safe_dump({**SUBMISSION_MANIFEST, "strategy": "guessed", "entrypoint": "main.py"}),
        "repro.py": "def broken(:\n    pass\n",
    })
    assert "reproducer.yaml: strategy must be one of faithful, injected." in problems
    assert "reproducer.yaml: entrypoint 'main.py' is not among the files." in problems
    assert "repro.py, line 1: invalid syntax (the code does not parse)." in problems
    assert any("never mentions SILENTBENCH_REPORT" in problem for problem in problems)
    assert any("never mentions --variant" in problem for problem in problems)
    _, problems = reproducer_problems({"repro.py": GOOD_REPRODUCER})
    assert problems[0].startswith("No reproducer.yaml")
    _, problems = reproducer_problems({**FILES, "reproducer.yaml": "needs: [1, 2]\n"})
    assert "reproducer.yaml: 'entrypoint' is not declared." in problems
    assert reproducer_problems(FILES) == (SUBMISSION_MANIFEST, [])


# --- the web form ---------------------------------------------------------------------------------

def test_anonymous_visitors_are_sent_to_sign_in(client):
    response = client.get("/submit/")
    assert response.status_code == 302 and response["Location"].startswith("/accounts/login/")


def test_a_contributor_submits_through_the_form_and_nothing_runs(client, django_capture_on_commit_callbacks):
    user = UserFactory()
    client.force_login(user)
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        response = client.post("/submit/", {**BUG_FORM, "files": uploads(FILES)})
    assert response.status_code == 302 and response["Location"] == "/submissions/mine/"
    version = ReproducerVersion.objects.get()
    assert version.review_state == ReviewState.PENDING and version.submitted_by == user
    assert version.files == FILES and version.default_steps == 4 and version.time_limit_seconds == 30
    bug = Bug.objects.get(bug_id="GH-4242")
    assert bug.status == BugStatus.SUBMITTED and bug.submitted_by == user
    assert callbacks == [] and Run.objects.count() == 0 and Campaign.objects.count() == 0
    page = client.get("/submissions/mine/").content.decode()
    assert "GH-4242" in page and "Waiting for review" in page and "starts on approval" in page


def test_the_form_reports_every_problem_and_stores_nothing(client):
    client.force_login(UserFactory())
    BugFactory(bug_id="GH-1", title="taken", status=BugStatus.SUBMITTED)
    broken = {**FILES, "repro.py": GOOD_REPRODUCER + "\nif True\n"}
    page = client.post("/submit/", {**BUG_FORM, "bug_id": "GH-1", "files": uploads(broken)}).content.decode()
    assert "Bug with this ID already exists." in page
    assert "repro.py, line " in page and "the code does not parse" in page
    page = client.post("/submit/", {**BUG_FORM, "bug_id": "pt 12", "files": uploads(FILES)}).content.decode()
    assert "is not a bug ID" in page
    assert ReproducerVersion.objects.count() == 0 and Bug.objects.count() == 1


def test_only_the_submitter_or_a_maintainer_sends_a_new_version(client):
    owner = UserFactory()
    first = do_submit_reproducer(FILES, bug_fields={k: v for k, v in BUG_FORM.items()
                                                            if k != "reproducer_name"}, acting_user=owner)
    client.force_login(UserFactory())
    assert client.get("/bugs/GH-4242/submit/").status_code == 404  # still unreviewed: hidden from others
    client.force_login(owner)
    changed = {**FILES, "repro.py": FILES["repro.py"].replace("trigger_step=1", "trigger_step=2")}
    response = client.post("/bugs/GH-4242/submit/", {"reproducer_name": "cpu", "files": uploads(changed)})
    assert response.status_code == 302
    second = ReproducerVersion.objects.exclude(pk=first.pk).get()
    assert second.review_state == ReviewState.PENDING
    assert second.approved_baseline() is None  # the first version was never approved
    page = client.post("/bugs/GH-4242/submit/", {"reproducer_name": "cpu", "files": uploads(changed)})
    assert "identical to version" in page.content.decode()


# --- review ---------------------------------------------------------------------------------------

@pytest.fixture
def submitted():
    return do_submit_reproducer(FILES, bug_fields={
        **{k: v for k, v in BUG_FORM.items() if k != "reproducer_name"}, "title": HOSTILE}, acting_user=UserFactory())


def test_the_review_queue_is_for_maintainers(client, submitted):
    client.force_login(submitted.submitted_by)
    assert client.get("/review/").status_code == 403
    assert client.post(f"/review/{submitted.pk}/", {"decision": "approve"}).status_code == 403
    assert ReproducerVersion.objects.get().review_state == ReviewState.PENDING


def test_a_maintainer_reads_the_diff_against_the_approved_version_and_rejects_with_a_reason(client, submitted):
    maintainer = MaintainerFactory()
    do_review_version(submitted, approve=True, verify=False, acting_user=maintainer)
    bug = submitted.reproducer.bug
    staged = {**FILES, "repro.py": FILES["repro.py"] + "\nimport os  # staged in an unreviewed version\n"}
    do_submit_reproducer(staged, bug=bug, acting_user=submitted.submitted_by)
    changed = {**staged, "repro.py": staged["repro.py"] + f"\n# {HOSTILE}\n"}
    second = do_submit_reproducer(changed, bug=bug, acting_user=submitted.submitted_by)
    client.force_login(maintainer)
    queue = client.get("/review/").content.decode()
    assert queue.count("Read and review") == 2 and HOSTILE not in queue and "&lt;script&gt;" in queue
    page = client.get(f"/review/{second.pk}/").content.decode()
    assert f"since the latest approved version, <code>{submitted.short_hash}</code>" in page
    assert "staged in an unreviewed version" in page  # the diff shows what the pending version staged too
    assert "repro.py" in page and "changed" in page and HOSTILE not in page
    assert client.post(f"/review/{second.pk}/", {"decision": "reject", "note": " "}).status_code == 200
    assert ReproducerVersion.objects.get(pk=second.pk).review_state == ReviewState.PENDING
    client.post(f"/review/{second.pk}/", {"decision": "reject", "note": "Please seed the data loader."})
    assert ReproducerVersion.objects.get(pk=second.pk).review_state == ReviewState.REJECTED
    client.force_login(submitted.submitted_by)
    mine = client.get("/submissions/mine/").content.decode()
    assert "Rejected" in mine and "Please seed the data loader." in mine
    assert Run.objects.count() == 0


def test_approval_starts_verification_and_completion_records_stability(client, submitted,
                                                                       django_capture_on_commit_callbacks):
    maintainer = MaintainerFactory()
    client.force_login(maintainer)
    with django_capture_on_commit_callbacks() as callbacks:
        client.post(f"/review/{submitted.pk}/", {"decision": "approve", "note": "read it"})
    assert len(callbacks) == 1  # the enqueueing of the verification runs, after commit
    campaign = Campaign.objects.get()
    assert campaign.purpose == CampaignPurpose.VERIFICATION and campaign.created_by == maintainer
    runs = list(campaign.runs.all())
    assert len(runs) == 6 and {(r.variant, r.detector.name) for r in runs} == {("buggy", "plain"), ("fixed", "plain")}
    assert {r.seed for r in runs} == {0, 1, 2} and all(r.reproducer_version == submitted for r in runs)
    assert Bug.objects.get(pk=submitted.reproducer.bug_id).status == BugStatus.APPROVED

    assert not do_complete_campaign(campaign)  # runs are still queued
    for run in runs:
        Run.objects.filter(pk=run.pk).update(status=RunStatus.SUCCEEDED, manifested=run.variant == "buggy")
    assert do_complete_campaign(campaign)
    assert not do_complete_campaign(campaign)  # exactly once
    [check] = StabilityCheck.objects.filter(campaign=campaign)
    assert (check.buggy_manifested, check.fixed_manifested, check.verdict) == (3, 0, "verified")
    assert Bug.objects.get(pk=submitted.reproducer.bug_id).status == BugStatus.VERIFIED
    client.force_login(submitted.submitted_by)
    mine = client.get("/submissions/mine/").content.decode()
    assert "Verified" in mine and f"/campaigns/{campaign.pk}/" in mine
    assert "buggy 3/3, fixed 0/3" in mine  # the verdict's figures, as the docs promise, not just "finished"


def test_a_version_is_reviewed_once():
    version = do_submit_reproducer(FILES, bug_fields={
        k: v for k, v in BUG_FORM.items() if k != "reproducer_name"}, acting_user=UserFactory())
    maintainer = MaintainerFactory()
    do_review_version(version, approve=False, note="no", acting_user=maintainer)
    with pytest.raises(Exception, match="already reviewed"):
        do_review_version(version, approve=True, acting_user=maintainer)
    assert Run.objects.count() == 0


# --- the API --------------------------------------------------------------------------------------

def test_the_api_takes_an_archive_and_reports_problems(django_capture_on_commit_callbacks):
    user = UserFactory()
    fields = {k: v for k, v in BUG_FORM.items() if k != "reproducer_name"}
    assert client_for().post("/api/submissions/", {**fields, "files": [archive(FILES)]}).status_code == 401
    response = client_for(user).post("/api/submissions/", {**fields, "files": [archive(FILES)]})
    assert response.status_code == 201, response.json()
    assert response.json()["review_state"] == "pending" and response.json()["bug"] == "GH-4242"
    broken = {**FILES, "repro.py": "import os\n"}
    response = client_for(user).post("/api/submissions/", {**fields, "bug_id": "GH-4243", "files": uploads(broken)})
    assert response.status_code == 400
    assert any("never mentions SILENTBENCH_REPORT" in problem for problem in response.json()["files"])
    response = client_for(user).post("/api/submissions/", {**fields, "files": [archive(FILES)]})
    assert response.status_code == 400 and "already exists" in str(response.json())
    assert [s["bug"] for s in client_for(user).get("/api/submissions/").json()["results"]] == ["GH-4242"]
    assert client_for(UserFactory()).get("/api/submissions/").json()["results"] == []

    version = ReproducerVersion.objects.get()
    assert client_for(user).post(f"/api/reproducer-versions/{version.pk}/review/",
                                 {"decision": "approve"}).status_code == 403
    with django_capture_on_commit_callbacks():
        response = client_for(MaintainerFactory()).post(f"/api/reproducer-versions/{version.pk}/review/",
                                                        {"decision": "approve", "note": "ok"})
    assert response.status_code == 200 and response.json()["review_state"] == "approved"
    assert Run.objects.filter(reproducer_version=version).count() == 6


def test_an_archive_of_countless_entries_is_refused_without_reading_them_all():
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as out:
        for i in range(5000):
            out.addfile(tarfile.TarInfo(f"f{i}.py"), io.BytesIO(b""))
    _, problems = read_uploads([SimpleUploadedFile("many.tar.gz", buffer.getvalue())])
    assert problems == ["The archive holds more than 20 files, the most that are accepted."]


def test_unreviewed_submissions_stay_out_of_the_public_catalog(client, submitted):
    for user in (None, UserFactory()):
        if user:
            client.force_login(user)
        assert "GH-4242" not in client.get("/catalog/").content.decode()
        assert "GH-4242" not in client.get("/catalog.csv").content.decode()
        assert client.get("/bugs/GH-4242/").status_code == 404
        assert client.get("/api/bugs/GH-4242/").status_code == 404
    client.force_login(submitted.submitted_by)
    assert client.get("/bugs/GH-4242/").status_code == 200 and "GH-4242" in client.get("/catalog/").content.decode()
    client.force_login(MaintainerFactory())
    assert client.get("/bugs/GH-4242/").status_code == 200
    do_review_version(submitted, approve=True, verify=False, acting_user=MaintainerFactory())
    client.logout()
    assert client.get("/bugs/GH-4242/").status_code == 200


def test_a_submitted_manifest_changes_where_runs_go_only_once_approved(submitted):
    maintainer = MaintainerFactory()
    do_review_version(submitted, approve=True, verify=False, acting_user=maintainer)
    needs = {**SUBMISSION_MANIFEST["needs"], "cuda": True, "world_size": 4}
    cuda = yaml.safe_dump({**SUBMISSION_MANIFEST, "needs": needs})
    newer = do_submit_reproducer({**FILES, "reproducer.yaml": cuda}, bug=submitted.reproducer.bug,
                                 acting_user=submitted.submitted_by)
    reproducer = newer.reproducer
    reproducer.refresh_from_db()
    assert (reproducer.needs_cuda, reproducer.world_size) == (False, 1)
    do_review_version(newer, approve=True, verify=False, acting_user=maintainer)
    reproducer.refresh_from_db()
    assert (reproducer.needs_cuda, reproducer.world_size) == (True, 4)
