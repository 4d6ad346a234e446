from django.apps import AppConfig
from django.db.models.signals import post_migrate


class CoreConfig(AppConfig):
    """What every app uses: roles and permissions, shared enums, charts, export formats, CLI helpers and
    the audit trail. It imports no other app of the project."""
    name = "core"
    verbose_name = "Core"

    def ready(self):
        from .roles import ensure_roles

        post_migrate.connect(ensure_roles, dispatch_uid="silentbench-roles")
