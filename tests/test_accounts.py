"""Sign-up, roles, named API tokens and their lifecycle, and the limit on sign-in attempts (docs/accounts.md;
the API uses tokens with the same rules)."""
from datetime import timedelta

import pytest
from axes.models import AccessAttempt
from django.contrib.auth.hashers import make_password
from django.contrib.auth.models import AnonymousUser, User
from django.db import connection
from django.db.models import F
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient
from rest_framework.throttling import SimpleRateThrottle

from accounts.actions import do_create_api_token, do_revoke_api_token, do_revoke_api_tokens_of
from accounts.models import ApiToken
from core.models import AuditEvent
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

    session = APIClient()
    session.force_login(user)
    created = session.post("/api/tokens/", {"name": "second"}, format="json")
    assert created.status_code == 201
    new_secret = created.json()["token"]
    listed = api(secret).get("/api/tokens/").json()["results"]
    assert sorted(t["name"] for t in listed) == ["first", "second"]
    assert all("token" not in t and "key_hash" not in t for t in listed)
    assert api(new_secret).get("/api/tokens/").status_code == 200

    revoked = api(secret).post(f"/api/tokens/{created.json()['id']}/revoke/")
    assert revoked.status_code == 200 and revoked.json()["revoked_at"]
    assert api(new_secret).get("/api/tokens/").status_code == 401
    assert session.post("/api/tokens/", {"name": "  "}, format="json").status_code == 400


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


# --- Tokens: a token cannot mint tokens; a password change revokes them (docs/accounts.md) ---

def test_a_token_cannot_create_tokens_but_a_session_can():
    user = UserFactory()
    token, secret = do_create_api_token("laptop", acting_user=user)
    refused = api(secret).post("/api/tokens/", {"name": "child"}, format="json")
    assert refused.status_code == 403 and "cannot create tokens" in refused.json()["detail"]
    assert list(ApiToken.objects.filter(user=user).values_list("name", flat=True)) == ["laptop"]
    session = APIClient()
    session.force_login(user)
    assert session.post("/api/tokens/", {"name": "desktop"}, format="json").status_code == 201
    assert api(secret).post(f"/api/tokens/{token.pk}/revoke/").status_code == 200  # revoking stays open to it


def assert_revoked(secret):
    response = api(secret).get("/api/tokens/")
    assert response.status_code == 401 and "was revoked" in response.json()["detail"]


def test_changing_the_password_revokes_every_token_of_the_account(client):
    user = UserFactory()
    secrets = [do_create_api_token(name, acting_user=user)[1] for name in ("laptop", "ci")]
    _, bystander = do_create_api_token("theirs", acting_user=UserFactory())
    client.force_login(user)
    new_password = "another long passphrase"
    response = client.post("/accounts/password_change/", {
        "old_password": PASSWORD, "new_password1": new_password, "new_password2": new_password})
    assert response.status_code == 302
    for secret in secrets:
        assert_revoked(secret)
    assert api(bystander).get("/api/tokens/").status_code == 200
    assert client.get("/account/").status_code == 200  # the session that changed it stays signed in


def test_setting_a_password_anywhere_revokes_the_tokens():
    """The admin, a password reset and ``manage.py changepassword`` all end in set_password and save."""
    user = UserFactory()
    _, secret = do_create_api_token("laptop", acting_user=user)
    user.set_password("a new long passphrase")
    user.save()
    assert_revoked(secret)


def test_rehashing_a_password_at_sign_in_is_not_a_change(client):
    """Django re-hashes a password whose hash is outdated (here: a short salt) when it is checked; the
    password is the same, so the tokens stay."""
    user = UserFactory()
    user.password = make_password(PASSWORD, salt="short", hasher="md5")
    user.save()
    _, secret = do_create_api_token("laptop", acting_user=user)
    assert client.post("/accounts/login/", {"username": user.username, "password": PASSWORD}).status_code == 302
    user.refresh_from_db()
    assert "$short$" not in user.password  # re-hashed
    assert api(secret).get("/api/tokens/").status_code == 200


# --- Sign-in attempts: per account and per client address, on the site and at /api/token/ (django-axes) ---

LIMIT = 3
LOCKED = "Too many failed sign-ins"


@pytest.fixture
def limit(settings, monkeypatch):
    """A small failure limit; DRF's own throttle of /api/token/ lifted (tests/test_security.py covers it), so
    that every refusal below is the lock-out's."""
    settings.AXES_FAILURE_LIMIT = LIMIT
    monkeypatch.setattr(SimpleRateThrottle, "THROTTLE_RATES", {"anon": None, "user": None, "token": None})
    return LIMIT


def sign_in(where, username, password, address="192.0.2.1", **headers):
    """One sign-in attempt on the site's login form or at /api/token/, from a fresh client at ``address``."""
    if where == "web":
        return Client().post("/accounts/login/", {"username": username, "password": password},
                             REMOTE_ADDR=address, **headers)
    return APIClient().post("/api/token/", {"username": username, "password": password},
                            REMOTE_ADDR=address, **headers)


def failed(where):
    return 200 if where == "web" else 400  # the form again, with its error; the API's 400


def assert_locked(response, where):
    assert response.status_code == 429 and int(response["Retry-After"]) == 15 * 60
    text = response.json()["detail"] if where == "api" else response.content.decode()
    assert LOCKED in text


@pytest.mark.parametrize("where", ["web", "api"])
def test_an_account_is_locked_after_failures_from_anywhere(where, limit):
    UserFactory(username="alice")
    statuses = [sign_in(where, "alice", "wrong", address=f"192.0.2.{n}").status_code for n in range(1, limit + 1)]
    assert statuses == [failed(where)] * (limit - 1) + [429]
    assert_locked(sign_in(where, "alice", PASSWORD, address="198.51.100.9"), where)  # the right password too
    assert sign_in(where, "bob-" + where, "wrong", address="198.51.100.9").status_code == failed(where)


@pytest.mark.parametrize("where", ["web", "api"])
def test_a_client_is_locked_after_failures_on_any_accounts(where, limit):
    UserFactory(username="bob")
    statuses = [sign_in(where, f"guess{n}", "wrong").status_code for n in range(limit)]
    assert statuses == [failed(where)] * (limit - 1) + [429]
    assert_locked(sign_in(where, "bob", PASSWORD), where)
    assert sign_in(where, "bob", PASSWORD, address="198.51.100.9").status_code in (201, 302)  # bob, elsewhere


@pytest.mark.parametrize("where", ["web", "api"])
def test_a_new_x_forwarded_for_per_attempt_changes_nothing(where, limit):
    """Without trusted proxies (SILENTBENCH_NUM_PROXIES=0) the header is ignored: the same client still."""
    UserFactory(username="carol")
    statuses = [sign_in(where, f"guess{n}", "wrong", HTTP_X_FORWARDED_FOR=f"203.0.113.{n}").status_code
                for n in range(limit)]
    assert statuses == [failed(where)] * (limit - 1) + [429]
    assert_locked(sign_in(where, "carol", PASSWORD, HTTP_X_FORWARDED_FOR="203.0.113.200"), where)


def test_the_lock_out_ends_after_the_cool_off(limit, settings):
    UserFactory(username="dave")
    for _ in range(limit):
        sign_in("web", "dave", "wrong")
    assert_locked(sign_in("web", "dave", PASSWORD), "web")
    AccessAttempt.objects.update(attempt_time=timezone.now() - settings.AXES_COOLOFF_TIME - timedelta(seconds=1))
    assert sign_in("web", "dave", PASSWORD).status_code == 302


def test_an_overlong_or_nul_username_is_refused_or_counted_within_bounds():
    """The API refuses both (400, naming the field); Django's login form checks no length, and the attempt
    is counted under the longest a username can be (no 500 on PostgreSQL's varchar); NUL is refused before
    any password is checked."""
    for username in ("x" * 10_000, "nul\x00name"):
        response = sign_in("api", username, "wrong")
        assert response.status_code == 400 and "username" in str(response.json())
        assert sign_in("web", username, "wrong").status_code in (200, 400)
    assert list(AccessAttempt.objects.values_list("username", flat=True)) == ["x" * 150]


def test_attempts_during_a_lock_out_do_not_extend_it(limit, settings):
    """One attempt per cool-off, the owner's right password included, must not keep an account locked for
    ever: attempts refused during a lock-out are not counted, so it ends a cool-off after the failure that
    locked it (django-axes' default, AXES_RESET_COOL_OFF_ON_FAILURE_DURING_LOCKOUT, restarted it each time)."""
    UserFactory(username="erin")
    for _ in range(limit):
        sign_in("web", "erin", "wrong")
    almost = settings.AXES_COOLOFF_TIME - timedelta(minutes=1)
    AccessAttempt.objects.update(attempt_time=F("attempt_time") - almost)
    for where, password in (("web", PASSWORD), ("api", PASSWORD), ("web", "wrong")):
        assert_locked(sign_in(where, "erin", password), where)
    assert list(AccessAttempt.objects.values_list("failures_since_start", flat=True)) == [limit]
    AccessAttempt.objects.update(attempt_time=F("attempt_time") - timedelta(minutes=2))  # the cool-off is over
    assert sign_in("web", "erin", PASSWORD).status_code == 302


def test_one_username_length_for_the_api_and_the_lock_outs():
    """The API's sign-in field and django-axes' count cut at the same length, the user model's."""
    from accounts.api import CredentialsSerializer
    from accounts.models import username_max_length
    from benchmark_site.security import attempted_username

    longest = username_max_length()
    assert longest == User._meta.get_field("username").max_length
    assert CredentialsSerializer().fields["username"].max_length == longest
    assert len(attempted_username(None, {"username": "x" * (longest + 50)})) == longest


def test_revoking_an_accounts_tokens_is_audited():
    """A password change revokes the account's tokens as the system; who did it and which tokens are recorded."""
    user = UserFactory(username="frank")
    for name in ("laptop", "ci"):
        do_create_api_token(name, acting_user=user)
    revoked_before = do_create_api_token("old", acting_user=user)[0]
    do_revoke_api_token(revoked_before, acting_user=user)
    admin = MaintainerFactory()
    assert do_revoke_api_tokens_of(user, acting_user=admin) == 2
    event = AuditEvent.objects.about(user).get()
    assert (event.actor, event.action, event.summary) == (admin, "revoke-api-tokens", "revoked 2 API token(s) of frank")
    assert sorted(name.split(" ")[0] for name in event.detail["tokens"]) == ["ci", "laptop"]
    assert do_revoke_api_tokens_of(user, acting_user=admin) == 0  # nothing left: nothing recorded
    user.set_password("a new long passphrase")
    user.save()
    assert AuditEvent.objects.about(user).count() == 1
    AuditEvent.objects.all().delete()
    do_create_api_token("again", acting_user=user)
    user.set_password("another new passphrase")
    user.save()
    assert AuditEvent.objects.about(user).get().actor_label == "the system"
