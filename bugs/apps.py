from django.apps import AppConfig


class BugsConfig(AppConfig):
    name = "bugs"
    verbose_name = "Bug catalog"
    # Read by core.roles: what the Maintainers group holds of this app (approve code, deprecate bugs)
    maintainer_permissions = ("bugs.approve_reproducerversion", "bugs.deprecate_bug")
