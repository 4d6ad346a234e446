from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError

from bugs.actions import do_deprecate_bug
from bugs.models import Bug


class Command(BaseCommand):
    help = "Retire a bug: it stays in the catalog, marked deprecated with the reason; its ID is never reused."

    def add_arguments(self, parser):
        parser.add_argument("bug_id")
        parser.add_argument("--reason", required=True)

    def handle(self, *args, bug_id, reason, **options):
        bug = Bug.objects.filter(bug_id=bug_id).first()
        if bug is None:
            raise CommandError(f"No bug {bug_id}.")
        try:
            do_deprecate_bug(bug, reason, acting_user=None)  # the operator
        except ValidationError as error:
            raise CommandError("; ".join(error.messages)) from error
        self.stdout.write(f"{bug_id} is deprecated: {reason}")
