from django.apps import AppConfig


class BugsConfig(AppConfig):
    name = "bugs"
    verbose_name = "Bug catalog"
