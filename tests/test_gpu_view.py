"""What a sealed run that holds devices (leased GPUs) sees beyond a CPU run: what CUDA's driver needs and no more.

No GPU here: the devices are stand-in character devices (/dev/null's numbers) made for the test, bound into the run
as a leased GPU's nodes are. That CUDA initialises in this view is checked on a GPU node by ``bin/gpu-check``.
"""
import json
import os
import stat
import sys
import uuid

import pytest

from runners.executor import Limits, run_sandboxed
from runners.executor.confinement import landlock_abi

from .test_sandbox import sealed  # noqa: F401 - the fixture seals every run

VIEW = r'''
import json, os, sys, threading
view = {"sys": os.path.isdir("/sys/bus/pci"), "sys_read_only": None, "interfaces": None, "device": None,
        "comm": None, "submounts": None}
if os.path.isdir("/sys"):
    view["sys_read_only"] = bool(os.statvfs("/sys").f_flag & os.ST_RDONLY)
    view["interfaces"] = sorted(os.listdir("/sys/class/net"))
    view["submounts"] = sorted(line.split()[4] for line in open("/proc/self/mountinfo")
                               if line.split()[4].startswith("/sys/"))
for path in sys.argv[1:]:
    try:
        with open(path, "r+b", buffering=0) as device:
            device.write(b"x")
        view["device"] = "written"
    except OSError as error:
        view["device"] = error.strerror
try:  # what CUDA's driver does as cuInit starts its threads
    with open(f"/proc/self/task/{threading.get_native_id()}/comm", "w") as comm:
        comm.write("cuda-evthandlr")
    view["comm"] = open(f"/proc/self/task/{threading.get_native_id()}/comm").read().strip()
except OSError as error:
    view["comm"] = error.strerror
print(json.dumps(view))
'''


@pytest.fixture
def stand_in_gpu():
    """A character device in /dev, as /dev/nvidia0 is on a GPU node."""
    path = f"/dev/silentbench-test-gpu-{uuid.uuid4().hex[:8]}"
    os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    os.chmod(path, 0o666)  # as the driver makes its nodes; mknod took the umask off
    yield path
    os.unlink(path)


def view_of(tmp_path, device, holds_it):
    script = tmp_path / "view.py"
    script.write_text(VIEW)
    devices = [device] if holds_it else []
    result = run_sandboxed([sys.executable, str(script), device], tmp_path, {"HOME": str(tmp_path)},
                           Limits(time_limit_seconds=60, memory_mb=512), devices=devices)
    assert result.exit_code == 0, result.stderr[-2000:]
    return json.loads(result.stdout), result.layers


def test_a_run_that_holds_devices_sees_a_read_only_sys_and_may_name_its_threads(tmp_path, stand_in_gpu):
    view, layers = view_of(tmp_path, stand_in_gpu, holds_it=True)
    assert view["device"] == "written"  # the leased node is usable on the read-only /dev
    assert view["sys"] and view["sys_read_only"]
    assert view["interfaces"] == ["lo"]  # a sysfs of its own: its network namespace's loopback, no host interface
    assert view["submounts"] == []  # no cgroup, debug or security file system of the host beneath it
    assert view["comm"] == "cuda-evthandlr"
    assert "gpu view: /sys read-only, /proc writable" in layers


def test_a_cpu_run_sees_no_sys_and_may_not_write_its_proc(tmp_path, stand_in_gpu):
    assert landlock_abi(), "Landlock is unavailable here: the test of /proc writes means nothing"
    view, layers = view_of(tmp_path, stand_in_gpu, holds_it=False)
    assert view["device"] == "No such file or directory"
    assert not view["sys"] and view["sys_read_only"] is None
    assert view["comm"] == "Permission denied"  # Landlock: writes only beneath its home, /tmp and /dev
    assert not [layer for layer in layers if layer.startswith("gpu view")]
