"""The check an operator runs on a new GPU node before it takes runs (``bin/gpu-check`` sets up its Python first).

The CUDA probe of runners.environments.gpu_check on every GPU, unsealed and then sealed as a run holding it; then
every CUDA reproducer of the catalog, buggy and fixed over ``--seeds`` seeds (3: a reproducer is verified at 3/3
buggy and 0/3 fixed), through a real ``celery worker -Q auto-gpu`` on this node (which checks its GPUs again as it
starts); then one table: the node (GPU, driver, CUDA, torch, the sandbox's layers), each probe, each run's verdict
and time, and each reproducer's tally. Exits 1 when a probe or a run did not do what it should: the sealed probe
failing, a run failing, a buggy variant not showing its bug, a fixed one showing it.
"""
from pathlib import Path

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError

from core.cli import comma_list, positive_int

from ...actions.campaigns import do_cancel_campaign, do_complete_campaign, do_start_verification
from ...actions.runs import do_give_up_running_runs
from ...environments.gpu_check import probe_gpu, probe_limits
from ...environments.host import gpu_inventory, host_facts
from ...executor import describe_confinement
from ...models import RunStatus
from ...progress import wait_for_campaign
from ...selectors import runnable_versions
from ...worker.local import local_worker, log_tail

RUN_PAIR_SECONDS = 140  # a buggy and a fixed run of one seed on one GPU, starts included: the default time for the runs


class Command(BaseCommand):
    help = "Check this GPU node: the CUDA probe unsealed and sealed on each GPU, then every CUDA reproducer."

    def add_arguments(self, parser):
        parser.add_argument("--bugs", help="only these bugs' CUDA reproducers (comma-separated IDs)")
        parser.add_argument("--no-runs", action="store_true", help="the probes only")
        parser.add_argument("--scratch", action="store_true",
                            help="the database, broker and run directories are this check's own (bin/gpu-check "
                                 "passes it): only then are the runs made, never in a lab's own")
        parser.add_argument("--seeds", type=positive_int, default=3,
                            help="seeds 0..N-1 of each variant (default 3: verified means 3/3 buggy, 0/3 fixed)")
        parser.add_argument("--timeout", type=positive_int,
                            help="seconds for all the runs (default: 140 per seed of each CUDA reproducer, over the "
                                 "GPU slots that passed)")
        parser.add_argument("--evaluate", action="store_true",
                            help="then the GPU evaluation (manage.py evaluate --cuda, the same seeds), stored in this "
                                 "check's database, written to --results-dir as results-gpu.md, and published "
                                 "there as a snapshot to ship (evaluation/published/)")
        parser.add_argument("--results-dir", help="where --evaluate writes (default: gpu-evaluation beside the check's "
                                                  "database)")
        parser.add_argument("--detectors", type=comma_list,
                            help="--evaluate's detectors (default: every one without a fit phase)")
        parser.add_argument("--evaluation-timeout", type=positive_int,
                            help="seconds for --evaluate's runs (default: none)")
        parser.add_argument("--overhead-timeout", type=positive_int,
                            help="seconds for --evaluate's overhead runs, after which none starts (default: none)")

    def handle(self, *args, bugs=None, no_runs=False, scratch=False, seeds=3, timeout=None, evaluate=False,
               results_dir=None, detectors=None, evaluation_timeout=None, overhead_timeout=None,
               **options):
        facts, gpus = host_facts(), gpu_inventory()
        import torch  # the node's own build: what the runs import

        self.line(f"node      {facts['host']}: {len(gpus)} GPU(s) {', '.join(gpu['name'] for gpu in gpus) or '-'}")
        self.line(f"driver    {facts['gpu_driver'] or '-'}, CUDA {facts['cuda'] or '-'}; torch {torch.__version__} "
                  f"(CUDA {torch.version.cuda or 'none'})")
        self.line(f"sandbox   {describe_confinement(probe_limits())}")
        if not gpus:
            raise CommandError("nvidia-smi lists no GPU on this node (or is not installed): nothing to check.")
        ok, usable = True, 0
        self.line("\nprobe     GPU  sealed  verdict                        cuInit  matmul error  free MB   seconds")
        for gpu in gpus:
            for sealed in (False, True):
                check = probe_gpu(gpu, sealed=sealed)
                found = check["facts"]
                self.line(f"          {gpu['index']:<4} {'yes' if sealed else 'no':<7} "
                          f"{'passed' if check['passed'] else 'FAILED: ' + check['reason']:<30.200} "
                          f"{fmt(found.get('cuinit'), 'd'):<7} {fmt(found.get('matmul_error'), '.1e'):<13} "
                          f"{fmt(found.get('free_mb'), 'd'):<9} {check['seconds']:.1f}")
                ok = ok and (check["passed"] or not sealed)
                usable += check["passed"] and sealed
        if not usable:
            self.line("\nruns      none: no GPU passed its sealed probe, so a worker here would offer none")
        elif not no_runs:
            ok = self.runs(bugs.split(",") if bugs else None, seeds, usable, timeout, scratch) and ok
            if evaluate:  # after the verification, whatever it found: a reproducer that failed is evaluated too
                folder = Path(results_dir) if results_dir else settings.VAR_DIR.parent / "gpu-evaluation"
                self.evaluate(bugs, detectors, seeds, (evaluation_timeout, overhead_timeout), folder)
        if not ok:
            raise CommandError("this node is not ready for GPU runs: see the FAILED lines above")
        self.line("\nthis node is ready for GPU runs")

    def evaluate(self, bugs, detectors, seeds, timeouts, folder):
        """The GPU evaluation in this check's database; its page and snapshot written to ``folder``; ``timeouts``,
        its runs' and its overhead's."""
        folder.mkdir(parents=True, exist_ok=True)
        page = folder / "results-gpu.md"
        self.line(f"\nevaluation  manage.py evaluate --cuda, {seeds} seed(s)")
        call_command("evaluate", cuda=True, seeds=seeds, timeout=timeouts[0],
                     overhead_timeout=timeouts[1], publish=str(folder),
                     detectors=detectors, bugs=bugs.split(",") if bugs else None, results=str(page),
                     stdout=self.stdout)

    def runs(self, bug_ids, seeds, gpu_count, timeout, scratch):
        embedded = (settings.DATABASES["default"]["ENGINE"].endswith("sqlite3")
                    and settings.CELERY_BROKER_URL.startswith("filesystem://"))
        if not (scratch and embedded):  # its worker would take a lab's GPU runs, and its campaign land in its database
            raise CommandError("The runs of gpu_check need a database and a broker of their own (SQLite and the "
                               "filesystem broker in a folder of the check's): run bin/gpu-check, which makes them, "
                               "or give --no-runs.")
        call_command("migrate", verbosity=0)
        call_command("load_catalog", verbosity=0)
        versions = runnable_versions(bug_ids, cuda=True)
        if not versions:
            raise CommandError("no CUDA reproducer in the catalog" + (f" for {', '.join(bug_ids)}" if bug_ids else ""))
        slots = gpu_count * settings.SILENTBENCH_RUNS_PER_GPU
        timeout = timeout or RUN_PAIR_SECONDS * seeds * len(versions) // slots
        # a verification: the bugs' verdicts on this GPU are recorded (and shipped with a published evaluation)
        campaign = do_start_verification(versions, seeds, acting_user=None)
        log = settings.VAR_DIR / "logs" / "gpu-check-worker.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        with local_worker(log, queues="auto-gpu", name="gpu-check", concurrency=slots) as worker:
            def watchdog():
                if worker.poll() is not None:
                    raise CommandError(f"The worker exited:\n{log_tail(log)}")

            wait_for_campaign(campaign, lambda line: None, timeout=timeout, watchdog=watchdog)
        if campaign.runs.filter(status__in=(RunStatus.QUEUED, RunStatus.RUNNING)).exists():
            do_give_up_running_runs(campaign, acting_user=None)  # not finished in time: the tally says so
            do_cancel_campaign(campaign, acting_user=None)
        else:
            do_complete_campaign(campaign)  # the stability checks, as verify_bugs records them
        runs = list(campaign.runs.select_related("reproducer_version__reproducer__bug").order_by("pk"))
        self.line("\nrun       reproducer                     variant  seed  status     verdict      seconds  reason")
        for run in runs:
            verdict = ("-" if run.manifested is None else "manifested" if run.manifested else "clean")
            seconds = f"{run.wall_seconds:.1f}" if run.wall_seconds is not None else "-"
            self.line(f"          {str(run.reproducer_version.reproducer):<30.30} {run.variant:<8} {run.seed:<5} "
                      f"{run.status:<10} {verdict:<12} {seconds:<8} {'' if as_expected(run) else 'FAILED: '}"
                      f"{run.failure_reason[:200]}")
        self.line("\ntally     reproducer                     buggy manifested  fixed manifested  verdict")
        for reproducer, tally in tallies(runs).items():
            self.line(f"          {reproducer:<30.30} {str(tally['buggy']) + '/' + str(tally['buggy_runs']):<17} "
                      f"{str(tally['fixed']) + '/' + str(tally['fixed_runs']):<17} {tally['verdict']}")
        return all(as_expected(run) for run in runs)

    def line(self, text):
        self.stdout.write(text)


def as_expected(run):
    """A buggy run that succeeded and showed its bug, or a fixed one that succeeded and did not."""
    return run.status == RunStatus.SUCCEEDED and run.manifested == (run.variant == "buggy")


def tallies(runs):
    """Per reproducer: how many buggy and fixed runs showed the bug, out of how many, and the verdict: verified
    when every buggy run showed it and no fixed run did, every run having succeeded."""
    found = {}
    for run in runs:
        tally = found.setdefault(str(run.reproducer_version.reproducer), dict.fromkeys(
            ("buggy", "buggy_runs", "fixed", "fixed_runs", "failed", "unfinished"), 0))
        tally[f"{run.variant}_runs"] += 1
        tally[run.variant] += bool(run.manifested)
        unfinished = run.status in (RunStatus.QUEUED, RunStatus.RUNNING)
        tally["unfinished"] += unfinished
        tally["failed"] += run.status != RunStatus.SUCCEEDED and not unfinished
    for tally in found.values():
        tally["verdict"] = ("runs not finished in time (--timeout)" if tally["unfinished"] else
                            "runs failed" if tally["failed"] else
                            "verified" if tally["buggy"] == tally["buggy_runs"] and not tally["fixed"] else
                            "not verified")
    return found


def fmt(value, spec):
    return "-" if value is None else format(value, spec)
