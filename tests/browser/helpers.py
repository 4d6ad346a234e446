"""Steps that many browser stories share. Each one asserts that it worked, so a story fails where it broke."""
import re

from playwright.sync_api import expect


def login(page, base_url, username, password):
    """Sign in through /accounts/login/ and land back on the front page, signed in."""
    page.goto(f"{base_url}/accounts/login/?next=/")
    page.fill("input[name=username]", username)
    page.fill("input[name=password]", password)
    page.click("main form button[type=submit]")
    expect(page.locator("header .account")).to_contain_text(username)


def signup(page, base_url, username, password, email=""):
    """Create an account through /accounts/signup/ (it signs the new user in) and land on the front page."""
    page.goto(f"{base_url}/accounts/signup/?next=/")
    page.fill("input[name=username]", username)
    if email:
        page.fill("input[name=email]", email)
    page.fill("input[name=password1]", password)
    page.fill("input[name=password2]", password)
    page.click("main form button[type=submit]")
    expect(page).to_have_url(re.compile(r"/$"))
    expect(page.locator("header .account")).to_contain_text(username)


def wait_for_plot(page, selector):
    """Wait until plotly has drawn into ``selector`` (its SVG exists), e.g. ``#loss-chart``."""
    page.wait_for_selector(f"{selector} .main-svg", state="attached")
