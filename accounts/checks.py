"""System checks of the sign-in limits' settings (``manage.py check --deploy``)."""
from django.conf import settings
from django.core.checks import Tags, Warning, register


@register(Tags.security, deploy=True)
def check_proxy_count(app_configs, **kwargs):
    """X-Forwarded-Proto trusted means a proxy in front; with SILENTBENCH_NUM_PROXIES=0 every client would then
    have the proxy's address, and a few wrong passwords from anyone would lock every sign-in out."""
    if getattr(settings, "SECURE_PROXY_SSL_HEADER", None) and settings.SILENTBENCH_NUM_PROXIES == 0:
        return [Warning(
            "SECURE_PROXY_SSL_HEADER trusts a proxy's X-Forwarded-Proto, but SILENTBENCH_NUM_PROXIES is 0: every "
            "client has the proxy's address, so the API's anonymous rate is shared by all, and "
            f"{settings.AXES_FAILURE_LIMIT} failed sign-ins from anyone lock out every account's sign-in.",
            hint="Set SILENTBENCH_NUM_PROXIES to the number of proxies in front of gunicorn that append to "
                 "X-Forwarded-For (1 behind one TLS proxy); see docs/operations.md.",
            id="accounts.W001")]
    return []


@register(Tags.security, deploy=True)
def check_proxy_count_without_a_proxy(app_configs, **kwargs):
    """No proxy trusted (DJANGO_HTTPS=false, or X-Forwarded-Proto not trusted) but SILENTBENCH_NUM_PROXIES > 0:
    unless a proxy does append to X-Forwarded-For, each client chooses its own address (a new throttle bucket
    and lock-out count per request). docker/compose.yaml sets 1 for the TLS proxy it expects in front."""
    if not getattr(settings, "SECURE_PROXY_SSL_HEADER", None) and settings.SILENTBENCH_NUM_PROXIES > 0:
        return [Warning(
            f"SILENTBENCH_NUM_PROXIES is {settings.SILENTBENCH_NUM_PROXIES} but no proxy's X-Forwarded-Proto is "
            "trusted: without a proxy that appends to X-Forwarded-For, every client chooses its own address, and "
            "the per-address throttles and sign-in limits count nothing.",
            hint="Set SILENTBENCH_NUM_PROXIES=0 when clients reach gunicorn directly; see docs/operations.md.",
            id="accounts.W002")]
    return []
