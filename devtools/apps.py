from django.apps import AppConfig


class DevtoolsConfig(AppConfig):
    """Benchmarking and development tooling: synthetic history, load and page benches, screenshots and
    the browser launcher. Installed in development and tests, not in production settings."""
    name = "devtools"
    verbose_name = "Development tools"
