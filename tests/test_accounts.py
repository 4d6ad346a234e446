"""Sign-up, roles and named API tokens (the roles of docs/accounts.md; the API uses tokens with the same rules)."""
from datetime import timedelta

import pytest
from django.contrib.auth.models import AnonymousUser, User
from django.db import connection
from django.utils import timezone
from rest_framework.test import APIClient

from accounts.actions import do_create_api_token, do_revoke_api_token
from accounts.models import ApiToken
from core.roles import role_of

from .factories import MaintainerFactory, UserFactory

pytestmark = pytest.mark.django_db

PASSWORD = "a-long-test-password"
CAMPAIGN = {"name": "c", "bugs": ["NO-SUCH-BUG"], "detectors": ["plain"], "seeds": [0]}
HOSTILE = "<script>alert(1)</script>"


def api(secret=None, keyword="Token"):
    client = APIClient()
    if secret:
        client.credentials(HTTP_AUTHORIZATION=f"{keyword} {secret}")
    return client


def test_signup_creates_a_contributor_and_signs_in(client):
    response = client.post("/accounts/signup/?next=/results/", {
        "username": "newcomer", "email": "", "password1": "correct horse battery", "password2": "correct horse battery",
        "next": "/results/"})
    assert response.status_code == 302 and response["Location"] == "/results/"
    user = User.objects.get(username="newcomer")
    assert role_of(user) == "contributor"
    assert int(client.session["_auth_user_id"]) == user.pk
    page = client.get("/account/")
    assert b"newcomer" in page.content and b"contributor" in page.content


def test_signup_refuses_an_outside_next(client):
    response = client.post("/accounts/signup/", {
        "username": "newcomer", "password1": "correct horse battery", "password2": "correct horse battery",
        "next": "https://evil.example/"})
    assert response["Location"] == "/"


def test_signup_shows_the_password_validator_message(client):
    response = client.post("/accounts/signup/", {"username": "newcomer", "password1": "password",
                                                 "password2": "password"})
    assert response.status_code == 200
    assert b"This password is too common." in response.content
    assert not User.objects.filter(username="newcomer").exists()


def test_role_of_each_role():
    assert role_of(None) == "anonymous"
    assert role_of(AnonymousUser()) == "anonymous"
    assert role_of(UserFactory()) == "contributor"
    assert role_of(MaintainerFactory()) == "maintainer"
    assert role_of(UserFactory(is_staff=True)) == "staff"


def test_nav_offers_sign_up_and_links_the_account(client):
    assert b'href="/accounts/signup/' in client.get("/").content
    client.force_login(UserFactory(username="alice"))
    assert b'<a href="/account/" title="Your account">alice</a>' in client.get("/").content


def test_token_lifecycle_on_a_write_endpoint():
    contributor_token, contributor_secret = do_create_api_token("laptop", acting_user=UserFactory())
    maintainer = MaintainerFactory()
    token, secret = do_create_api_token("ci", acting_user=maintainer)

    assert api(contributor_secret).post("/api/campaigns/", CAMPAIGN, format="json").status_code == 403
    response = api(secret, keyword="Bearer").post("/api/campaigns/", CAMPAIGN, format="json")
    assert response.status_code == 400  # past authentication and permission: the bug does not exist
    token.refresh_from_db()
    assert token.last_used_at is not None

    do_revoke_api_token(token, acting_user=maintainer)
    response = api(secret).post("/api/campaigns/", CAMPAIGN, format="json")
    assert response.status_code == 401
    assert "was revoked" in response.json()["detail"]
    assert api("not-a-token").get("/api/tokens/").status_code == 401


def test_last_used_is_written_at_most_once_a_minute():
    token, secret = do_create_api_token("script", acting_user=UserFactory())
    recently = timezone.now() - timedelta(seconds=10)
    ApiToken.objects.filter(pk=token.pk).update(last_used_at=recently)
    assert api(secret).get("/api/tokens/").status_code == 200
    token.refresh_from_db()
    assert token.last_used_at == recently
    ApiToken.objects.filter(pk=token.pk).update(last_used_at=recently - timedelta(minutes=1))
    api(secret).get("/api/tokens/")
    token.refresh_from_db()
    assert token.last_used_at > recently


def test_another_user_cannot_revoke_my_token(client):
    token, secret = do_create_api_token("mine", acting_user=UserFactory())
    mallory = UserFactory()  # the edges check ownership (the action does not)
    _, mallory_secret = do_create_api_token("hers", acting_user=mallory)
    assert api(mallory_secret).post(f"/api/tokens/{token.pk}/revoke/").status_code == 404
    assert api(mallory_secret).delete(f"/api/tokens/{token.pk}/").status_code == 404
    client.force_login(mallory)
    assert client.post(f"/account/tokens/{token.pk}/revoke/").status_code == 404
    token.refresh_from_db()
    assert token.revoked_at is None
    do_revoke_api_token(token, acting_user=UserFactory(is_staff=True))  # staff may
    token.refresh_from_db()
    assert token.revoked_at is not None


def test_the_secret_is_not_stored():
    token, secret = do_create_api_token("laptop", acting_user=UserFactory())
    assert token.prefix == secret[:8] and len(secret) >= 40
    with connection.cursor() as cursor:
        cursor.execute("SELECT * FROM accounts_apitoken")
        stored = [str(value) for row in cursor.fetchall() for value in row]
    assert secret not in stored
    assert ApiToken.hash_secret(secret) in stored


def test_api_lists_creates_and_revokes_own_tokens():
    user = UserFactory()
    _, secret = do_create_api_token("first", acting_user=user)
    do_create_api_token("someone else's", acting_user=UserFactory())
    assert api().get("/api/tokens/").status_code == 401

    created = api(secret).post("/api/tokens/", {"name": "second"}, format="json")
    assert created.status_code == 201
    new_secret = created.json()["token"]
    listed = api(secret).get("/api/tokens/").json()["results"]
    assert sorted(t["name"] for t in listed) == ["first", "second"]
    assert all("token" not in t and "key_hash" not in t for t in listed)
    assert api(new_secret).get("/api/tokens/").status_code == 200

    revoked = api(secret).post(f"/api/tokens/{created.json()['id']}/revoke/")
    assert revoked.status_code == 200 and revoked.json()["revoked_at"]
    assert api(new_secret).get("/api/tokens/").status_code == 401
    assert api(secret).post("/api/tokens/", {"name": "  "}, format="json").status_code == 400


def test_token_endpoint_exchanges_a_password_for_a_named_token():
    user = UserFactory(username="alice")
    response = api().post("/api/token/", {"username": "alice", "password": PASSWORD, "name": "cluster"})
    assert response.status_code == 201
    assert ApiToken.objects.get(user=user).name == "cluster"
    assert api(response.json()["token"]).get("/api/tokens/").json()["count"] == 1
    assert api().post("/api/token/", {"username": "alice", "password": "wrong"}).status_code == 400


def test_tokens_page_shows_the_secret_once_and_revokes(client):
    user = UserFactory()
    client.force_login(user)
    response = client.post("/account/tokens/", {"name": "laptop"})
    token = ApiToken.objects.get(user=user)
    secret = response.context["new_secret"]
    assert secret.encode() in response.content and ApiToken.hash_secret(secret) == token.key_hash
    assert secret.encode() not in client.get("/account/tokens/").content
    assert client.get(f"/account/tokens/{token.pk}/revoke/").status_code == 405
    client.post(f"/account/tokens/{token.pk}/revoke/")
    token.refresh_from_db()
    assert token.revoked_at is not None


def test_hostile_names_are_escaped_on_the_tokens_page(client):
    user = UserFactory(username=HOSTILE)
    do_create_api_token(HOSTILE, acting_user=user)
    client.force_login(user)
    content = client.get("/account/tokens/").content.decode()
    assert HOSTILE not in content
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in content
