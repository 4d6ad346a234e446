"""The version matrix (evaluation.versions): bug x torch release cells from factory-made plain runs (the outcome by
the majority of seeds, the stability verdict by the verification's rule), the page and the bug page, the exports in
every format (LaTeX compiled by a real TeX engine, as tests/test_latex.py compiles the others), docs/versions.md and
the command that queues the matrix."""
import io
import json
import re

import pytest
from django.core.management import CommandError, call_command

from evaluation.models import Bisection, BisectionProbe, BisectionStatus
from evaluation.versions import MATRIX_KEY
from runners.environments.routing import in_environment
from runners.models import Campaign, PythonEnvironment, Run, RunStatus

from .factories import (
    BugFactory,
    CampaignFactory,
    DetectorFactory,
    ReproducerFactory,
    ReproducerVersionFactory,
    RunFactory,
)
from .helpers import HOSTILE, latex_rows, table
from .test_latex import compiled

pytestmark = pytest.mark.django_db


def environment(release, default=False):
    torch = f"{release}+cpu" if default else release
    return PythonEnvironment.objects.get_or_create(
        name=f"py3.11-torch{torch}", defaults={"torch": torch, "python": "3.11.7", "is_default": default,
                                               "requirements": [] if default else [f"torch=={release}"],
                                               "resolved": {"torch": torch}})[0]


def runs(campaign, version, env, variant, outcomes):
    """One plain run per seed: "m" manifested, "-" did not, "x" failed, "q" still queued."""
    for seed, outcome in enumerate(outcomes):
        status = {"x": RunStatus.FAILED, "q": RunStatus.QUEUED}.get(outcome, RunStatus.SUCCEEDED)
        RunFactory(campaign=campaign, reproducer_version=version, python_environment=env, variant=variant, seed=seed,
                   status=status, manifested=None if outcome in "xq" else outcome == "m",
                   detector=DetectorFactory(name="plain"))


@pytest.fixture
def matrix():
    """TEST-A reproduces on 2.11.0 (verified), not on 2.13.0 (its fix), and fails on 2.15.0 (one seed crashed, one
    did not manifest); TEST-B's runs on 2.15.0 are still queued, and it did not run on 2.11.0. A run under another
    detector, and an older matrix campaign, are left out."""
    campaign = CampaignFactory(name="version matrix", parameters={MATRIX_KEY: {"releases": ["2.11.0", "2.13.0",
                                                                                          "2.15.0"]}})
    a = ReproducerVersionFactory(reproducer=ReproducerFactory(bug=BugFactory(bug_id="TEST-A", title=HOSTILE)))
    b = ReproducerVersionFactory(reproducer=ReproducerFactory(bug=BugFactory(bug_id="TEST-B"), name="cpu-old"))
    old, new, newest = environment("2.11.0"), environment("2.13.0", default=True), environment("2.15.0")
    runs(campaign, a, old, "buggy", "mmm")
    runs(campaign, a, old, "fixed", "---")
    runs(campaign, a, new, "buggy", "---")
    runs(campaign, a, new, "fixed", "---")
    runs(campaign, a, newest, "buggy", "mx-")
    runs(campaign, a, newest, "fixed", "---")
    runs(campaign, b, new, "buggy", "mm-")
    runs(campaign, b, new, "fixed", "m--")
    runs(campaign, b, newest, "buggy", "qq")
    RunFactory(campaign=campaign, reproducer_version=a, python_environment=new, detector=DetectorFactory(
        name="nan_inf"), status=RunStatus.SUCCEEDED, manifested=True)
    older = CampaignFactory(name="older matrix", parameters={MATRIX_KEY: {"releases": ["2.9.0"]}})
    runs(older, a, environment("2.9.0"), "buggy", "m")
    Campaign.objects.filter(pk=older.pk).update(created_at=campaign.created_at.replace(year=2000))
    return campaign


def test_the_page_shows_each_cell_with_its_outcome_counts_and_stability(client, matrix):
    page = client.get("/results/versions/").content.decode()
    assert HOSTILE not in page
    rows = table(page, "version-matrix")
    assert [row["Bug"] for row in rows] == ["TEST-A", "TEST-B"]
    a, b = rows
    assert a["torch 2.11.0"] == "reproduces buggy 3/3, fixed 0/3 verified"
    assert a["torch 2.13.0"] == "does not buggy 0/3, fixed 0/3 unreproducible"
    assert a["torch 2.15.0"] == "fails buggy 1/3, fixed 0/3, 1 failed flaky"
    assert a["Flips"] == "reproduces -> does not at 2.13.0"
    assert b["torch 2.11.0"] == "–"
    assert b["torch 2.13.0"] == "reproduces buggy 2/3, fixed 1/3 flaky"
    assert b["torch 2.15.0"] == "pending 2 runs to go"
    assert f"campaign #{matrix.pk}" in page and "torch 2.11.0, 2.13.0, 2.15.0; seeds 0, 1, 2." in page


def test_another_campaign_is_chosen_by_id_and_a_wrong_one_says_so(client, matrix):
    older = Campaign.objects.get(name="older matrix")
    rows = table(client.get("/results/versions/", {"campaign": older.pk}).content.decode(), "version-matrix")
    assert rows == [{"Bug": "TEST-A", "Reproducer": "cpu", "torch 2.9.0": "reproduces buggy 1/1, fixed 0/0 verified",
                     "Flips": "none"}]
    both = table(client.get(f"/results/versions/?campaign={older.pk}&campaign={matrix.pk}").content.decode(),
                 "version-matrix")
    assert list(both[0]) == ["Bug", "Reproducer", "torch 2.9.0", "torch 2.11.0", "torch 2.13.0", "torch 2.15.0",
                             "Flips"]
    missing = client.get("/results/versions/", {"campaign": 999})
    assert missing.status_code == 404 and "No campaign #999." in missing.content.decode()
    assert client.get("/results/versions/", {"campaign": "x"}).status_code == 404
    assert client.get("/results/versions.csv", {"campaign": 999}).status_code == 404


@pytest.mark.parametrize("value", ["\u00b2", "9" * 30])
@pytest.mark.parametrize("address", ["/results/versions/", "/results/versions.csv"])
def test_a_campaign_that_no_id_can_name_is_not_found(client, matrix, address, value):
    """A superscript digit (isdigit, but no int) or a number past any key is a 404, not a 500."""
    assert client.get(address, {"campaign": value}).status_code == 404


def test_two_campaigns_of_the_same_seeds_are_judged_over_all_their_runs(client):
    version = ReproducerVersionFactory(reproducer=ReproducerFactory(bug=BugFactory(bug_id="TEST-A")))
    env = environment("2.11.0")
    ids = []
    for name in ("one", "two"):
        campaign = CampaignFactory(name=name, parameters={MATRIX_KEY: {"releases": ["2.11.0"]}})
        runs(campaign, version, env, "buggy", "mmm")
        runs(campaign, version, env, "fixed", "---")
        ids.append(campaign.pk)
    both = table(client.get("/results/versions/", {"campaign": ids}).content.decode(), "version-matrix")
    assert both[0]["torch 2.11.0"] == "reproduces buggy 6/6, fixed 0/6 verified"


def test_without_a_matrix_campaign_the_page_says_how_to_make_one(client):
    response = client.get("/results/versions/")
    assert response.status_code == 200
    said = re.search(r'<p id="versions-error">(.*?)</p>', response.content.decode(), re.S).group(1)
    assert said == "No version-matrix campaign yet: manage.py version_matrix creates one."  # no stray backticks
    echoed = client.get("/results/versions/", {"campaign": "[a](https://evil.example)"}).content.decode()
    assert 'href="https://evil.example"' not in echoed  # what the query says is shown as text, never as markup
    with pytest.raises(CommandError, match="No version-matrix campaign yet"):
        call_command("export", "versions", stdout=io.StringIO())


def test_the_results_page_links_the_matrix(client, matrix):
    RunFactory(campaign=CampaignFactory(), status=RunStatus.SUCCEEDED, manifested=True)
    assert 'href="/results/versions/"' in client.get("/results/").content.decode()


def test_the_bug_page_shows_its_row(client, matrix):
    page = client.get("/bugs/TEST-A/").content.decode()
    rows = table(page, "version-matrix")
    assert [(row["Bug"], row["torch 2.11.0"]) for row in rows] == [
        ("TEST-A", "reproduces buggy 3/3, fixed 0/3 verified")]
    assert "No bisection yet." in page
    assert "No version-matrix campaign has run this bug" in client.get(
        f"/bugs/{BugFactory(bug_id='TEST-C').bug_id}/").content.decode()


def test_the_exports_agree_with_the_page_and_the_command(client, matrix):
    csv = client.get("/results/versions.csv").content.decode()
    assert csv.splitlines()[0] == "bug,reproducer,2.11.0,2.13.0,2.15.0,flips"
    records = client.get("/results/versions.json").json()
    assert records[0]["2.11.0"] == "reproduces (buggy 3/3, fixed 0/3; verified)"
    assert records[1]["2.11.0"] is None and records[1]["2.15.0"] == "pending (2 runs to go)"
    markdown = client.get("/results/versions.md").content.decode()
    assert "| TEST-A | cpu | reproduces (buggy 3/3, fixed 0/3; verified) |" in markdown
    for fmt in ("csv", "md", "tex", "json"):
        out = io.StringIO()
        call_command("export", "versions", "--format", fmt, "--campaign", str(matrix.pk), stdout=out)
        assert out.getvalue() == client.get(f"/results/versions.{fmt}").content.decode()
    with pytest.raises(CommandError, match="takes only --campaign, not detector"):
        call_command("export", "versions", "--detector", "plain", stdout=io.StringIO())
    assert json.loads(client.get("/results/versions.json", {"campaign": matrix.pk}).content) == records


def test_the_latex_export_compiles_with_its_caption_and_cells(client, matrix, tmp_path):
    latex = client.get("/results/versions.tex").content.decode()
    assert latex.startswith("% SilentBench versions. Preamble: \\usepackage{")
    assert r"\begin{table*}" in latex and r"\label{tab:silentbench-versions}" in latex and r"\toprule" in latex
    rows = latex_rows(latex)
    assert rows[0]["bug"] == "TEST-A" and rows[0]["2.11.0"] == "reproduces (buggy 3/3, fixed 0/3; verified)"
    assert rows[1]["2.11.0"] == "--"
    text, pages = compiled(latex, tmp_path)
    assert pages == 1
    assert "Table 1: Version matrix: what each torch release does" in text
    assert f"Runs: SilentBench version-matrix campaign #{matrix.pk}" in text and "TEST-B" in text
    # four releases (two campaigns) still fit the page
    older = Campaign.objects.get(name="older matrix")
    latex = client.get(f"/results/versions.tex?campaign={older.pk}&campaign={matrix.pk}").content.decode()
    text, pages = compiled(latex, tmp_path)
    assert pages == 1 and "version-matrix campaigns" in text


def test_versions_doc_is_written_from_the_stored_runs(matrix, tmp_path):
    output = tmp_path / "versions.md"
    call_command("versions_doc", "--output", str(output), stdout=io.StringIO())
    text = output.read_text()
    assert text.startswith("# Bugs across torch releases\n")
    assert "| TEST-A | cpu | reproduces (buggy 3/3, fixed 0/3; verified) |" in text
    assert "* TEST-A (cpu): reproduces on 2.11.0, does not on 2.13.0." in text
    assert "_No bisection has finished yet._" in text
    assert ("Environments (runners.environments): `py3.11-torch2.11.0` (torch 2.11.0); `py3.11-torch2.13.0+cpu` "
            "(torch 2.13.0+cpu, the workers' own interpreter); `py3.11-torch2.15.0` (torch 2.15.0).") in text
    version = Run.objects.filter(reproducer_version__reproducer__bug__bug_id="TEST-A").first().reproducer_version
    bisection = Bisection.objects.create(bug=version.reproducer.bug, reproducer_version=version, good="2.11.0",
                                         bad="2.13.0", releases=["2.11.0", "2.13.0"], seeds=[0, 1, 2],
                                         status=BisectionStatus.FINISHED, first_changed="2.13.0", last_same="2.11.0",
                                         reason="the oracle says reproduces up to 2.11.0 and does not from 2.13.0")
    for release, outcome, manifested in (("2.11.0", "reproduces", 3), ("2.13.0", "does_not", 0)):
        BisectionProbe.objects.create(bisection=bisection, round=1, release=release, outcome=outcome, runs=3,
                                      manifested=manifested, seconds=4.5)
    call_command("versions_doc", "--output", str(output), stdout=io.StringIO())
    assert (f"| {bisection.pk} | TEST-A | cpu | 2.11.0 -&gt; 2.13.0 (2 releases) | 3 | first changed at 2.13.0 | "
            "round 1: 2.11.0 reproduces 3/3, 2.13.0 does not 0/3 | 1 | 6 | 9.0 | – |") in output.read_text()


def test_the_command_queues_every_cpu_reproducer_in_every_release(matrix):
    """Environments already recorded are looked up, not built; a reproducer that declares an older torch runs only
    in the environments that have it (runners.plans)."""
    environment("2.13.0", default=True)
    for release in ("2.11.0", "2.15.0"):
        env = environment(release)
        env.resolved = {"torch": release}
        env.save()
    old_only = ReproducerVersionFactory(reproducer=ReproducerFactory(bug=BugFactory(bug_id="TEST-OLD")))
    old_only.manifest = {**old_only.manifest, "needs": {**old_only.manifest["needs"], "packages": ["torch<2.12"]}}
    type(old_only).objects.filter(pk=old_only.pk).update(manifest=old_only.manifest)
    out = io.StringIO()
    call_command("version_matrix", "--releases", "2.15.0,2.11.0,2.13.0", "--seeds", "2", stdout=out)
    campaign = Campaign.objects.filter(parameters__has_key=MATRIX_KEY).order_by("-id").first()
    assert campaign.parameters[MATRIX_KEY] == {"releases": ["2.11.0", "2.13.0", "2.15.0"]}
    created = Run.objects.filter(campaign=campaign)
    assert set(created.values_list("detector__name", flat=True)) == {"plain"}
    per_release = {}
    for bug, torch in created.values_list("reproducer_version__reproducer__bug__bug_id", "python_environment__torch"):
        per_release.setdefault(bug, set()).add(torch)
    assert per_release["TEST-OLD"] == {"2.11.0"}
    assert per_release["TEST-A"] == {"2.11.0", "2.13.0+cpu", "2.15.0"}
    assert created.filter(reproducer_version__reproducer__bug__bug_id="TEST-A").count() == 2 * 2 * 3
    waiting = ", ".join(["cpu", *(in_environment("cpu", f"py3.11-torch{release}") for release in ("2.11.0", "2.15.0"))])
    assert f"No live worker consumes {waiting} yet" in out.getvalue()
    with pytest.raises(CommandError, match="'latest' is not a release version"):
        call_command("version_matrix", "--releases", "latest", stdout=io.StringIO())
