"""The roles (docs/accounts.md). Anonymous: browse and export. Contributor (any signed-in user): submit
bugs and reproducers. Maintainer (the Maintainers group): approve, trigger runs, deprecate.
Staff: the admin. The API applies the same rules to a token's user.

The maintainer's permissions belong to the apps that check them: each app's AppConfig lists its own
(``maintainer_permissions``, "app.codename" as views, templates and predicates name them), and this module reads
them from there, naming no app of the project."""
from django.apps import apps

MAINTAINERS_GROUP = "Maintainers"

ANONYMOUS, CONTRIBUTOR, MAINTAINER, STAFF = "anonymous", "contributor", "maintainer", "staff"

CAPABILITIES = {
    ANONYMOUS: ["Browse the catalog, runs and results", "Export tables (CSV, Markdown, LaTeX, JSON)"],
    CONTRIBUTOR: ["Submit bugs and reproducers (a maintainer reviews the code before anything runs)",
                  "Create and revoke API tokens"],
    MAINTAINER: ["Approve reproducer code for execution", "Trigger runs and campaigns", "Deprecate bugs"],
    STAFF: ["Use the admin site"],
}
_LADDER = [ANONYMOUS, CONTRIBUTOR, MAINTAINER, STAFF]


def maintainer_permissions():
    """Every app's maintainer permissions, "app.codename", as its AppConfig lists them (``maintainer_permissions``)."""
    return [name for config in apps.get_app_configs() for name in getattr(config, "maintainer_permissions", ())]


def is_maintainer(user):
    """Whoever holds the maintainer's permissions: members of the Maintainers group, superusers, or a
    user granted them directly. The same test as the views and the API apply, so the role shown and
    the actions allowed never disagree."""
    if user is None or not user.is_authenticated:
        return False
    return all(user.has_perm(name) for name in maintainer_permissions())


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
    for app_label, codename in (name.split(".") for name in maintainer_permissions()):
        permission = Permission.objects.filter(content_type__app_label=app_label, codename=codename).first()
        if permission:
            group.permissions.add(permission)
