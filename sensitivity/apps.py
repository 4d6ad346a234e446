from django.apps import AppConfig


class SensitivityConfig(AppConfig):
    name = "sensitivity"
    verbose_name = "Sensitivity track"
