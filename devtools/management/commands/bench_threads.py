"""Benchmark: runs per second of concurrent sealed runs, with each run's thread budget and without it.

Each round runs ``--runs`` sealed warm runs of a small training workload (the size of the catalog's CPU
reproducers), ``--concurrency`` at a time, as a worker of that concurrency does; once with the budget a worker gives
each run (``max(1, cores // concurrency)`` threads: runners.execution.run_threads) and once without (every run's
torch starts one thread per core, as before). Rounds alternate the order of the two modes. Prints each round's runs
per second, then per mode the median and the ratio of the medians; never asserts.

    SILENTBENCH_VAR_DIR=/tmp/benchvar .venv/bin/python manage.py bench_threads [--rounds 3] [--concurrency 6]
"""
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from core.cli import positive_int
from runners.environments.host import usable_cores
from runners.executor import Limits, run_sandboxed

WORKLOAD = '''
import json, os, sys, torch
torch.manual_seed(int(sys.argv[1]))
model = torch.nn.Sequential(torch.nn.Linear(128, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
data, target = torch.randn(256, 128), torch.randint(0, 10, (256,))
for step in range(int(sys.argv[2])):
    optimizer.zero_grad()
    torch.nn.functional.cross_entropy(model(data), target).backward()
    optimizer.step()
with open(os.environ["SILENTBENCH_REPORT"], "a") as report:
    report.write(json.dumps({"event": "oracle", "manifested": False, "threads": torch.get_num_threads()}) + "\\n")
'''


class Command(BaseCommand):
    help = "Runs per second of concurrent sealed runs, with and without each run's thread budget."

    def add_arguments(self, parser):
        parser.add_argument("--rounds", type=positive_int, default=3, help="rounds per mode (default 3)")
        parser.add_argument("--runs", type=positive_int, default=24, help="runs per round (default 24)")
        parser.add_argument("--concurrency", type=positive_int, default=6, help="runs at once (default 6)")
        parser.add_argument("--steps", type=positive_int, default=150, help="training steps of each run")

    def handle(self, *args, **options):
        cores, concurrency = usable_cores(), options["concurrency"]
        budget = max(1, cores // concurrency)
        folder = Path(tempfile.mkdtemp(prefix="bench-threads-"))
        modes = {f"budget ({budget} thread(s) a run)": budget, f"no budget ({cores} a run)": 0}
        rates: dict[str, list[float]] = {mode: [] for mode in modes}
        self.run_one(folder, 0, 0, options["steps"])  # the zygote starts before anything is timed
        for index in range(options["rounds"]):
            order = list(modes) if index % 2 == 0 else list(reversed(modes))
            for mode in order:
                started = time.monotonic()
                with ThreadPoolExecutor(concurrency) as pool:
                    list(pool.map(lambda seed: self.run_one(folder, seed, modes[mode], options["steps"]),
                                  range(options["runs"])))
                rates[mode].append(options["runs"] / (time.monotonic() - started))
                self.stdout.write(f"round {index} {mode:>28}: {rates[mode][-1]:.2f} runs/s")
        self.stdout.write(f"\n{options['runs']} runs a round at concurrency {concurrency} on {cores} cores, "
                          f"{options['rounds']} rounds per mode:")
        medians = {mode: statistics.median(values) for mode, values in rates.items()}
        for mode, median in medians.items():
            self.stdout.write(f"  {mode:>28}: median {median:.2f} runs/s (min {min(rates[mode]):.2f}, "
                              f"max {max(rates[mode]):.2f})")
        with_budget, without = medians.values()
        self.stdout.write(f"  ratio with / without: {with_budget / without:.2f}")

    def run_one(self, folder, seed, threads, steps):
        workdir = Path(tempfile.mkdtemp(dir=folder))
        (workdir / "workload.py").write_text(WORKLOAD)
        report = workdir / "report.jsonl"
        env = {"HOME": str(workdir), "PATH": "/usr/bin:/bin", "SILENTBENCH_REPORT": str(report)}
        result = run_sandboxed([sys.executable, "workload.py", str(seed), str(steps)], workdir, env,
                               Limits(time_limit_seconds=600, memory_mb=2048, threads=threads), warm=True,
                               report_path=report)
        if result.ending() is not None:
            raise CommandError(f"a run failed ({result.ending()}): {result.stderr[-2000:]}")
