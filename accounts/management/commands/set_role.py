from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError

from accounts.actions import do_set_role
from core.roles import CONTRIBUTOR, MAINTAINER


class Command(BaseCommand):
    help = ("Make a user a maintainer (approve code, trigger runs, deprecate bugs: the Maintainers group) or a "
            "contributor again, without the admin. Anyone who signs up is a contributor.")

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("role", choices=[CONTRIBUTOR, MAINTAINER])

    def handle(self, *args, username, role, **options):
        user = get_user_model().objects.filter(username=username).first()
        if user is None:
            raise CommandError(f"No user named {username!r}: they sign up at /accounts/signup/ first "
                               "(or manage.py createsuperuser).")
        try:
            now = do_set_role(user, role, acting_user=None)
        except ValidationError as error:
            raise CommandError(" ".join(error.messages)) from error
        self.stdout.write(f"{username}'s role: {now}.")
