"""Comparing two campaigns or two environments, result by result."""
import csv
import io

import pytest

from runners.actions.detectors import do_record_detector

from .factories import (
    AlarmFactory,
    BugFactory,
    CampaignFactory,
    EnvironmentFactory,
    ReproducerFactory,
    ReproducerVersionFactory,
    RunFactory,
)
from .helpers import HOSTILE, table

pytestmark = pytest.mark.django_db


def environment(host, torch, gpu=""):
    return EnvironmentFactory(fingerprint=f"{host}-{torch}", host=host, torch=torch, gpu=gpu, python="3.11")


@pytest.fixture
def sides():
    """Campaign A on torch 2.1, campaign B on torch 2.4. On B: TEST-GONE stops reproducing, the guard
    misses TEST-MISS it caught before, catches TEST-NEW it missed, and alarms on TEST-MISS's fixed run."""
    before = CampaignFactory(name="before")
    after = CampaignFactory(name=HOSTILE)
    old, new = environment("old-box", "2.1.2"), environment(HOSTILE, "2.4.1", "NVIDIA H100")
    guard, plain = do_record_detector("param_not_updated"), do_record_detector("plain")
    versions = {bug_id: ReproducerVersionFactory(reproducer=ReproducerFactory(bug=BugFactory(bug_id=bug_id)))
                for bug_id in ("TEST-GONE", "TEST-MISS", "TEST-NEW", "TEST-SAME")}

    def run(campaign, bug_id, detector, variant, manifested, alarm_steps=()):
        made = RunFactory(campaign=campaign, environment=old if campaign == before else new,
                          reproducer_version=versions[bug_id], detector=detector, variant=variant,
                          status="succeeded", steps=10, trigger_step=3, manifested=manifested)
        for step in alarm_steps:
            AlarmFactory(run=made, step=step, rule=HOSTILE, message=HOSTILE)

    for campaign in (before, after):
        later = campaign == after
        run(campaign, "TEST-GONE", plain, "buggy", manifested=not later)
        run(campaign, "TEST-MISS", guard, "buggy", True, [] if later else [5])
        run(campaign, "TEST-MISS", guard, "fixed", False, [4] if later else [])
        run(campaign, "TEST-NEW", guard, "buggy", True, [6] if later else [])
        run(campaign, "TEST-SAME", guard, "buggy", True, [3])
    run(before, "TEST-SAME", plain, "fixed", False)  # only in A
    return {"before": before, "after": after, "old": old, "new": new}


def rows_by_key(page):
    return {(r["Bug / reproducer"], r["Detector"], r["Variant"]): r for r in table(page, "comparison")}


def test_two_campaigns_result_by_result(client, sides):
    query = {"a": f"campaign:{sides['before'].pk}", "b": f"campaign:{sides['after'].pk}"}
    page = client.get("/results/compare/", query).content.decode()
    rows = rows_by_key(page)
    assert rows[("TEST-GONE cpu", "plain", "buggy")]["Change"] == "stopped reproducing"
    assert rows[("TEST-GONE cpu", "plain", "buggy")]["A"] == "manifested 1/1"
    assert rows[("TEST-GONE cpu", "plain", "buggy")]["B"] == "manifested 0/1"
    assert rows[("TEST-MISS cpu", "param_not_updated", "buggy")]["Change"] == "detector started missing"
    assert rows[("TEST-MISS cpu", "param_not_updated", "fixed")]["Change"] == "new false alarm"
    assert rows[("TEST-MISS cpu", "param_not_updated", "fixed")]["B"] == "manifested 0/1 · false alarm 1/1"
    assert rows[("TEST-NEW cpu", "param_not_updated", "buggy")]["Change"] == "newly detected"
    assert rows[("TEST-NEW cpu", "param_not_updated", "buggy")]["B"] == "manifested 1/1 · detected 1/1"
    assert rows[("TEST-SAME cpu", "param_not_updated", "buggy")]["Change"] == "same"
    assert rows[("TEST-SAME cpu", "plain", "fixed")]["Change"] == "only in A"
    order = [r["Change"] for r in table(page, "comparison")]
    assert order[:4] == ["stopped reproducing", "detector started missing", "new false alarm", "newly detected"]
    summary = page.split('id="compare-summary"', 1)[1].split("</ul>", 1)[0]
    for change, count in (("stopped reproducing", 1), ("detector started missing", 1), ("new false alarm", 1),
                          ("started reproducing", 0), ("newly detected", 1), ("only in A", 1)):
        assert f">{change}</span>\n      <strong>{count}</strong>" in summary, change
    only = rows_by_key(client.get("/results/compare/", {**query, "only_changes": "on"}).content.decode())
    assert len(only) == 4 and ("TEST-SAME cpu", "param_not_updated", "buggy") not in only


def test_comparison_downloads_hold_the_rows_on_screen(client, sides):
    query = {"a": f"campaign:{sides['before'].pk}", "b": f"campaign:{sides['after'].pk}", "only_changes": "on",
             "detector": "param_not_updated"}
    page = client.get("/results/compare/", query).content.decode()
    assert "/results/compare.csv?a=campaign" in page
    on_screen = [(r["Bug / reproducer"], r["Detector"], r["Variant"], r["Change"]) for r in table(page, "comparison")]
    records = client.get("/results/compare.json", query).json()
    assert on_screen == [(f"{r['bug']} {r['reproducer']}", r["detector"], r["variant"], r["changes"])
                         for r in records]
    assert len(records) == 3  # the plain row is filtered out with the detector filter
    missed = next(r for r in records if r["changes"] == "detector started missing")
    assert (missed["a_runs"], missed["a_detected"], missed["b_runs"], missed["b_detected"]) == (1, 1, 1, 0)
    rows = list(csv.DictReader(io.StringIO(client.get("/results/compare.csv", query).content.decode())))
    assert [r["changes"] for r in rows] == [r["changes"] for r in records]
    assert client.get("/results/compare.csv", {"a": "campaign:1"}).status_code == 400


def test_environments_and_torch_versions_as_sides(client, sides):
    by_torch = {"a": "torch:2.1.2", "b": "torch:2.4.1"}
    by_environment = {"a": f"environment:{sides['old'].pk}", "b": f"environment:{sides['new'].pk}"}
    by_gpu = {"a": "gpu:", "b": "gpu:NVIDIA H100"}
    expected = client.get("/results/compare.json", {"a": f"campaign:{sides['before'].pk}",
                                                    "b": f"campaign:{sides['after'].pk}"}).json()
    for query in (by_torch, by_environment, by_gpu):
        assert client.get("/results/compare.json", query).json() == expected
    page = client.get("/results/compare/", by_torch).content.decode()
    assert "<strong>A</strong>: torch 2.1.2" in page and 'value="torch:2.4.1" selected' in page


def test_hostile_names_in_the_comparison_are_text(client, sides):
    page = client.get("/results/compare/", {"a": f"environment:{sides['old'].pk}",
                                            "b": f"campaign:{sides['after'].pk}"}).content.decode()
    assert "<script>alert" not in page
    assert "&lt;script&gt;" in page  # the campaign name and the environment's host, in the pickers and labels


def test_one_side_chosen_preselects_without_errors(client, sides):
    page = client.get("/results/compare/", {"a": f"campaign:{sides['before'].pk}"}).content.decode()
    assert f'value="campaign:{sides["before"].pk}" selected' in page
    assert "This field is required" not in page and 'id="comparison"' not in page
    campaign_page = client.get(f"/campaigns/{sides['before'].pk}/").content.decode()
    assert f'href="/results/compare/?a=campaign:{sides["before"].pk}"' in campaign_page
