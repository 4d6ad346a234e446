"""The detector plugin registry.

A detector is one module in this package that defines a ``DetectorPlugin`` subclass decorated
with ``@register``. Nothing else needs to change: the registry imports every module here.
These modules run inside the sandboxed reproducer too, so they must not import Django.
"""
from .base import DetectorPlugin, Probe, all_plugins, campaign_plugins, get_plugin, register

__all__ = ["DetectorPlugin", "Probe", "register", "get_plugin", "all_plugins", "campaign_plugins"]
