from django.apps import AppConfig


class RunnersConfig(AppConfig):
    name = "runners"
    verbose_name = "Runs and detectors"

    def ready(self):
        from . import receivers  # noqa: F401  (verification starts when a reproducer version is approved)
