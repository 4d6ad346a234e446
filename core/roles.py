"""The roles (docs/accounts.md). Anonymous: browse and export. Contributor (any signed-in user): submit
bugs and reproducers. Maintainer (the Maintainers group): approve, trigger runs, deprecate.
Staff: the admin. The API applies the same rules to a token's user."""
MAINTAINERS_GROUP = "Maintainers"
# The maintainer's permissions, as views (permission_required), templates (perms) and predicates name them.
TRIGGER_PERMISSION = "runners.trigger_campaign"
APPROVE_PERMISSION = "bugs.approve_reproducerversion"
DEPRECATE_PERMISSION = "bugs.deprecate_bug"
MAINTAINER_PERMISSIONS = [tuple(name.split(".")) for name in (TRIGGER_PERMISSION, APPROVE_PERMISSION,
                                                                  DEPRECATE_PERMISSION)]

ANONYMOUS, CONTRIBUTOR, MAINTAINER, STAFF = "anonymous", "contributor", "maintainer", "staff"

CAPABILITIES = {
    ANONYMOUS: ["Browse the catalog, runs and results", "Export tables (CSV, Markdown, LaTeX, JSON)"],
    CONTRIBUTOR: ["Submit bugs and reproducers (a maintainer reviews the code before anything runs)",
                  "Create and revoke API tokens"],
    MAINTAINER: ["Approve reproducer code for execution", "Trigger runs and campaigns", "Deprecate bugs"],
    STAFF: ["Use the admin site"],
}
_LADDER = [ANONYMOUS, CONTRIBUTOR, MAINTAINER, STAFF]


def is_maintainer(user):
    """Whoever holds the maintainer's permissions: members of the Maintainers group, superusers, or a
    user granted them directly. The same test as the views and the API apply, so the role shown and
    the actions allowed never disagree."""
    if user is None or not user.is_authenticated:
        return False
    return all(user.has_perm(f"{app}.{codename}") for app, codename in MAINTAINER_PERMISSIONS)


def role_of(user):
    """The highest role of ``user``: "anonymous", "contributor", "maintainer" or "staff"."""
    if user is None or not user.is_authenticated:
        return ANONYMOUS
    if user.is_staff:
        return STAFF
    return MAINTAINER if is_maintainer(user) else CONTRIBUTOR


def capabilities_of(user):
    """What the user may do, role by role. A staff member who is not in the Maintainers group has
    the admin but not the maintainer's actions."""
    role = role_of(user)
    roles = _LADDER[:_LADDER.index(role) + 1]
    if role == STAFF and not is_maintainer(user):
        roles.remove(MAINTAINER)
    return [item for r in roles for item in CAPABILITIES[r]]


def ensure_roles(**kwargs):
    """The Maintainers group with the maintainer's permissions (run after every migrate)."""
    from django.contrib.auth.models import Group, Permission

    group, _ = Group.objects.get_or_create(name=MAINTAINERS_GROUP)
    for app_label, codename in MAINTAINER_PERMISSIONS:
        permission = Permission.objects.filter(content_type__app_label=app_label, codename=codename).first()
        if permission:
            group.permissions.add(permission)
