"""What the catalog tells the apps above it, which it does not import (runners starts a verification
when a version is approved: runners/receivers.py)."""
from django.dispatch import Signal

# Sent inside do_review_version's transaction with ``version`` and ``acting_user`` when a maintainer
# approves a bug's reproducer version and asks for its verification.
version_approved = Signal()
