"""The roles of DESIGN.md. Anonymous: browse and export. Contributor (any signed-in user): submit
bugs and reproducers. Maintainer (the Maintainers group): approve, trigger runs, deprecate.
Staff: the admin. The API applies the same rules to a token's user."""
from runners.apps import MAINTAINERS_GROUP

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
    """Members of the Maintainers group, and superusers (who hold every permission)."""
    if user is None or not user.is_authenticated:
        return False
    if not hasattr(user, "_silentbench_is_maintainer"):  # once per request's user object
        user._silentbench_is_maintainer = user.is_superuser or user.groups.filter(name=MAINTAINERS_GROUP).exists()
    return user._silentbench_is_maintainer


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
