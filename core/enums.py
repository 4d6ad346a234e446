"""The vocabulary that several apps share, each stated once: every other module uses these, with no aliases."""
from django.db import models


class Variant(models.TextChoices):
    """The two sides of every bug reproducer; a clean reference pipeline has only ``fixed``."""
    BUGGY = "buggy", "buggy"
    FIXED = "fixed", "fixed"


class ReviewState(models.TextChoices):
    """A maintainer's review of submitted code, the same for reproducer versions and detector versions
    (core.review)."""
    PENDING = "pending", "Waiting for review"
    APPROVED = "approved", "Approved"
    REJECTED = "rejected", "Rejected"


class VerificationVerdict(models.TextChoices):
    """What a verification over k seeds says of a reproducer (a stability check), and so of its bug: verified
    (buggy manifested k/k, fixed 0/k, no run failed), unreproducible (buggy never manifested), flaky otherwise."""
    VERIFIED = "verified", "Verified"
    FLAKY = "flaky", "Flaky"
    UNREPRODUCIBLE = "unreproducible", "Unreproducible"


def worst_verdict(first: str, second: str) -> str:
    """The worse of two verdicts (verified < flaky < unreproducible): a bug with several reproducers takes the
    worst of theirs."""
    return max(first, second, key=list(VerificationVerdict).index)


class AuditAction(models.TextChoices):
    """What an audit event records (core.audit.record): the state changes made on someone's behalf."""
    CREATE = "create", "created"
    CANCEL = "cancel", "cancelled"
    RETRY = "retry", "retried"
    SUBMIT = "submit", "submitted"
    APPROVE = "approve", "approved"
    REJECT = "reject", "rejected"
    DEPRECATE = "deprecate", "deprecated"
    VERDICT = "verdict", "verdict given"
    HOLD_OUT = "hold-out", "held out"
    PUBLISH = "publish", "published"
    LOAD = "load", "loaded"
    RECORD = "record", "recorded"
    RETABULATE = "retabulate", "retabulated"
    FINISH = "finish", "finished"
    FAIL = "fail", "failed"
    REVOKE_API_TOKENS = "revoke-api-tokens", "revoked API tokens"
    SET_ROLE = "set-role", "set the role"
