"""The detector plugin registry.

A detector is one module in this package that defines a ``DetectorPlugin`` subclass decorated
with ``@register``. Nothing else needs to change: the registry imports every module here.
These modules run inside the sandboxed reproducer too, so they must not import Django.
"""
import importlib
import pkgutil

from .base import DetectorPlugin, Probe, register, registered_plugins

__all__ = ["DetectorPlugin", "Probe", "register", "get_plugin", "all_plugins"]

_loaded = False


def _load_all():
    global _loaded
    if not _loaded:
        for module in pkgutil.iter_modules(__path__):
            if module.name != "base":
                importlib.import_module(f"{__name__}.{module.name}")
        _loaded = True


def all_plugins():
    """Every registered plugin, by name."""
    _load_all()
    return dict(sorted(registered_plugins.items()))


def get_plugin(name):
    plugins = all_plugins()
    if name not in plugins:
        raise KeyError(f"unknown detector {name!r}; registered: {', '.join(plugins)}")
    return plugins[name]
