"""What runners does when the catalog tells it something (bugs.signals)."""
from django.dispatch import receiver

from bugs.signals import version_approved

from .actions.campaigns import do_start_verification


@receiver(version_approved, dispatch_uid="runners-verify-approved-version")
def verify_approved_version(sender, version, acting_user, seeds, **kwargs):
    do_start_verification([version], seeds=seeds, acting_user=acting_user)
