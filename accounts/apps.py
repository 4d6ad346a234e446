from django.apps import AppConfig


class AccountsConfig(AppConfig):
    name = "accounts"
    verbose_name = "Accounts and API tokens"

    def ready(self):
        # Registers the proxy count's system check and the OpenAPI description of token authentication.
        from . import checks, schema  # noqa: F401
