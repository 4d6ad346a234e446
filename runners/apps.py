from django.apps import AppConfig
from django.db.models.signals import post_migrate

MAINTAINERS_GROUP = "Maintainers"
MAINTAINER_PERMISSIONS = [
    ("runners", "trigger_campaign"),
    ("bugs", "approve_reproducerversion"),
    ("bugs", "deprecate_bug"),
]


def ensure_roles(**kwargs):
    """The Maintainers group: approve code, trigger runs, deprecate bugs (DESIGN.md's roles)."""
    from django.contrib.auth.models import Group, Permission

    group, _ = Group.objects.get_or_create(name=MAINTAINERS_GROUP)
    for app_label, codename in MAINTAINER_PERMISSIONS:
        permission = Permission.objects.filter(content_type__app_label=app_label, codename=codename).first()
        if permission:
            group.permissions.add(permission)


class RunnersConfig(AppConfig):
    name = "runners"
    verbose_name = "Runs and detectors"

    def ready(self):
        post_migrate.connect(ensure_roles, sender=self)
