"""Benchmark: what each run's CPU share (its own cgroup, ``cpu.shares`` 1024) does to overhead pairs timed beside a
busy neighbour.

An overhead pair is two sealed warm runs of the same clean workload, one under ``plain`` and one under a detector
(``--detector``, default ``nan_inf``), and its figure is the ratio of their median step times (evaluation.overhead).
Here every pair is timed while a neighbour run holds ``--processes`` busy processes for the whole pair. With a cgroup
per run the kernel shares the CPU between the runs; without (every run in the worker's cgroup, as before), it shares
it between processes and threads, so the neighbour's take most of it. The same pairs run in both modes, interleaved
(with, without, without, with, ...). Prints, per mode, the pairs' ratios, their median and spread (the
interquartile range and max/min), and the workload's median step time; never asserts.

    SILENTBENCH_VAR_DIR=/tmp/benchvar .venv/bin/python manage.py bench_cpu_share [--pairs 6] [--processes 8]
"""
import json
import statistics
import sys
import tempfile
import threading
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from core.cli import positive_int
from runners.detectors.base import PROBE_PRELOAD, PROBE_START
from runners.execution import PROBE_DIR, REPO_ROOT
from runners.executor import Limits, cgroup_support, run_sandboxed

WORKLOAD = '''
import json, os, sys, time, torch
torch.manual_seed(int(sys.argv[1]))
torch.set_num_threads(1)
model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 256))
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
data = torch.randn(64, 256)
with open(os.environ["SILENTBENCH_REPORT"], "a") as report:
    for step in range(int(sys.argv[2])):
        started = time.perf_counter()
        optimizer.zero_grad()
        loss = model(data).pow(2).mean()
        loss.backward()
        optimizer.step()
        report.write(json.dumps({"event": "step", "step": step, "rank": 0, "loss": loss.item(),
                                 "seconds": time.perf_counter() - started}) + "\\n")
    report.write(json.dumps({"event": "oracle", "manifested": False}) + "\\n")
'''
NEIGHBOUR = '''
import os, sys, time
until = time.monotonic() + float(sys.argv[2])
children = []
for _ in range(int(sys.argv[1])):  # processes, not threads: each holds a core's worth of work (no GIL between them)
    pid = os.fork()
    if pid == 0:
        x = 0
        while time.monotonic() < until:
            x += 1
        os._exit(0)
    children.append(pid)
for pid in children:
    os.waitpid(pid, 0)
'''


class Command(BaseCommand):
    help = "Overhead pairs beside a busy neighbour, with and without a CPU share per run (a cgroup per run)."

    def add_arguments(self, parser):
        parser.add_argument("--pairs", type=positive_int, default=6, help="pairs per mode (default 6)")
        parser.add_argument("--processes", type=positive_int, default=8, help="the neighbour's busy processes")
        parser.add_argument("--steps", type=positive_int, default=60, help="steps of each timed run")
        parser.add_argument("--detector", default="nan_inf", help="the detector of each pair (default nan_inf)")
        parser.add_argument("--neighbour-seconds", type=positive_int, default=25,
                            help="how long the neighbour stays busy, from the start of each pair (default 25)")

    def handle(self, *args, **options):
        if not cgroup_support().version:
            raise CommandError(f"This worker makes no cgroup per run here ({cgroup_support().error}).")
        folder = Path(tempfile.mkdtemp(prefix="bench-cpu-share-"))
        (folder / "workload.py").write_text(WORKLOAD)
        (folder / "neighbour.py").write_text(NEIGHBOUR)
        ratios, steps = {"cgroup per run": [], "no cgroup": []}, {"cgroup per run": [], "no cgroup": []}
        for index in range(options["pairs"]):
            order = ["cgroup per run", "no cgroup"] if index % 2 == 0 else ["no cgroup", "cgroup per run"]
            for mode in order:
                plain, detected = self.pair(folder, index, mode, options)
                ratios[mode].append(detected / plain)
                steps[mode].append(plain)
                self.stdout.write(f"pair {index} {mode:>14}: plain {plain * 1000:.2f} ms/step, "
                                  f"{options['detector']} {detected * 1000:.2f} ms/step, ratio {detected / plain:.3f}")
        self.stdout.write(f"\nOverhead pairs ({options['detector']} / plain, median step time), beside a neighbour "
                          f"of {options['processes']} busy processes, {options['pairs']} pairs per mode:")
        for mode, values in ratios.items():
            quartiles = statistics.quantiles(values, n=4) if len(values) >= 2 else [values[0]] * 3
            self.stdout.write(
                f"  {mode:>14}: median ratio {statistics.median(values):.3f}, interquartile range "
                f"{quartiles[2] - quartiles[0]:.3f}, max/min {max(values) / min(values):.3f}, "
                f"plain median step {statistics.median(steps[mode]) * 1000:.2f} ms")

    def pair(self, folder, index, mode, options):
        """(plain's, the detector's) median step time of one pair, timed beside the neighbour."""
        own = mode == "cgroup per run"
        neighbour = threading.Thread(target=self.run, args=(folder, ["neighbour.py", str(options["processes"]),
                                                                     str(options["neighbour_seconds"])], None, own))
        neighbour.start()
        try:
            return tuple(self.run(folder, ["workload.py", str(index), str(options["steps"])], detector, own)
                         for detector in ("plain", options["detector"]))
        finally:
            neighbour.join()

    def run(self, folder, arguments, detector, own_cgroup):
        """One sealed warm run; the median of its steps' own times (the first five left out), or None."""
        workdir = Path(tempfile.mkdtemp(dir=folder))
        for name in ("workload.py", "neighbour.py"):
            (workdir / name).write_text((folder / name).read_text())
        report = workdir / "report.jsonl"
        env = {"HOME": str(workdir), "PATH": "/usr/bin:/bin", "SILENTBENCH_REPORT": str(report)}
        if detector not in (None, "plain"):
            env.update({"PYTHONPATH": f"{PROBE_DIR}:{REPO_ROOT}", "SILENTBENCH_DETECTOR": detector,
                        "SILENTBENCH_DETECTOR_CONFIG": "{}"})
        limits = Limits(time_limit_seconds=300, memory_mb=2048, own_cgroup=own_cgroup)
        result = run_sandboxed([sys.executable, *arguments], workdir, env, limits, warm=True, preload=PROBE_PRELOAD,
                               report_path=report,
                               probe=PROBE_START if detector not in (None, "plain") else "")
        if detector is None:
            return None
        if result.ending() is not None:
            raise CommandError(f"the timed run failed ({result.ending()}): {result.stderr[-2000:]}")
        seconds = [json.loads(line)["seconds"] for line in result.report_text.splitlines()
                   if '"event": "step"' in line]
        return statistics.median(seconds[5:])
