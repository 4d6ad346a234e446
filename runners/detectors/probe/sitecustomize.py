"""Loaded by every Python process of an instrumented run (every rank): installs the detector.

The runner puts this folder and the repository root on PYTHONPATH and names the detector in
SILENTBENCH_DETECTOR. An error here must not be silent, so it is reported and re-raised.
"""
import os

if os.environ.get("SILENTBENCH_DETECTOR"):
    from runners.detectors.base import start_probe

    start_probe()
