from django.apps import AppConfig


class RunnersConfig(AppConfig):
    name = "runners"
    verbose_name = "Runs and detectors"
    maintainer_permissions = ("runners.trigger_campaign",)  # runners.permissions.TRIGGER_PERMISSION

    def ready(self):
        from core.caching import shows_on

        from . import receivers  # noqa: F401  (verification starts when a reproducer version is approved)
        from .models import Campaign, Detector, Environment, StabilityCheck
        from .selectors import runs_that_may_change

        # What this app's template tags render on the catalog's pages (stability, "caught by", a bug's runs)
        shows_on("catalog", StabilityCheck, Campaign, Detector)
        shows_on("bug", StabilityCheck, Environment, Campaign, Detector, runs_that_may_change)
