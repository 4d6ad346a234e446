"""Who may do what to runs and campaigns, checked at the edge: views, the API and the admin."""
TRIGGER_PERMISSION = "runners.trigger_campaign"


def can_trigger(user):
    """Create, cancel and retry campaigns (maintainers)."""
    return bool(user and user.is_authenticated and user.has_perm(TRIGGER_PERMISSION))
