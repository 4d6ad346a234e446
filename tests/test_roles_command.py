"""Roles without the admin (issue 33's contributor path): ``manage.py set_role USER maintainer|contributor``,
through ``do_set_role``, audited; a maintainer may then approve and trigger, a contributor may not."""
import io

import pytest
from django.core.management import CommandError, call_command

from core.models import AuditEvent
from core.roles import is_maintainer

from .factories import UserFactory

pytestmark = pytest.mark.django_db


def test_a_user_becomes_a_maintainer_and_back_from_the_command_line():
    user = UserFactory(username="ada")
    out = io.StringIO()
    call_command("set_role", "ada", "maintainer", stdout=out)
    assert out.getvalue() == "ada's role: maintainer.\n" and is_maintainer(type(user).objects.get(pk=user.pk))
    call_command("set_role", "ada", "contributor", stdout=io.StringIO())
    assert not is_maintainer(type(user).objects.get(pk=user.pk))
    assert list(AuditEvent.objects.filter(action="set-role").values_list("summary", flat=True).order_by("id")) == [
        "ada: contributor -> maintainer", "ada: maintainer -> contributor"]


def test_an_unknown_user_or_role_is_a_clear_error():
    with pytest.raises(CommandError, match="No user named 'nobody': they sign up at /accounts/signup/ first"):
        call_command("set_role", "nobody", "maintainer")
    UserFactory(username="ada")
    with pytest.raises(CommandError, match="invalid choice: 'owner'"):
        call_command("set_role", "ada", "owner")
