"""Verdicts and selections in a real browser (issue 16): the results page keeps one selection active (its script
runs under the Content-Security-Policy), and a run page leads with its verdict."""
import re

import pytest
from playwright.sync_api import expect

from ..factories import CampaignFactory, EvaluationFactory
from ..helpers import make_runs

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_one_selection_at_a_time_and_the_verdict_first(page, live_site, page_events):
    campaign = CampaignFactory(name="nightly")
    runs = make_runs(campaign=campaign)
    evaluation = EvaluationFactory()

    page.goto(f"/results/?campaign={campaign.pk}")
    evaluation_select, campaign_select = page.locator("select#evaluation"), page.locator("select#campaign")
    expect(evaluation_select).to_be_disabled()
    expect(page.locator("#selection")).to_contain_text("Live tables of campaign nightly")
    campaign_select.select_option("")
    expect(evaluation_select).to_be_enabled()
    campaign_select.select_option(str(campaign.pk))
    expect(evaluation_select).to_be_disabled()
    campaign_select.select_option("")
    evaluation_select.select_option(str(evaluation.pk))
    expect(campaign_select).to_have_value("")
    page.get_by_role("button", name="Show").click()
    expect(page).to_have_url(re.compile(rf"evaluation={evaluation.pk}&campaign=&"))
    expect(page.locator("#selection")).to_contain_text(f"Stored tables of evaluation #{evaluation.pk}")

    page.goto(f"/runs/{runs['detected'].pk}/")
    expect(page.locator("#verdict")).to_have_text("Verdict: detected at step 5 (trigger 3), 0 false alarms")
    page.goto(f"/campaigns/{campaign.pk}/")
    expect(page.locator(f"#runs tr:has(a[href='/runs/{runs['early'].pk}/']) td").nth(8)).to_have_text("missed")
