"""What the catalog tells the apps above it, which it does not import (runners starts a verification
when a version is approved: runners/receivers.py)."""
from django.dispatch import Signal

# Sent inside do_review_version's transaction with ``version``, ``acting_user`` and ``seeds`` when a
# maintainer approves a bug's reproducer version and asks for its verification. A receiver's database
# writes commit or roll back with the approval (an error in it refuses the approval); anything outside the
# database (a broker message) must wait for the commit (transaction.on_commit), as do_create_campaign does.
version_approved = Signal()
