import json
import signal
import sys
import time
from pathlib import Path

import torch
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError

from core.cli import comma_list, exit_on_sigterm, line_writer, positive_int, source_commit
from evaluation.models import Device, Evaluation
from evaluation.traincheck_protocols.measuring import (
    benchmark_figures,
    measure_overhead,
    measure_runs,
    measured_at,
    rejudge,
)
from evaluation.traincheck_protocols.protocol import DATA_FILE, FOLD_ORDER, PARTS
from evaluation.traincheck_protocols.rendering import render
from runners.detectors.traincheck import tool_version
from runners.selectors import runnable_versions


class Command(BaseCommand):
    help = ("Measure TrainCheck under its paper's protocol (relevant invariant per bug, per-invariant false positives "
            "over leave-one-out folds of the clean pipelines, overhead with 100 invariants) through campaigns and a "
            "local worker, store the figures as JSON and write the three-column comparison with the benchmark's "
            "protocol (a stored evaluation) as Markdown.")

    def add_arguments(self, parser):
        docs = settings.BASE_DIR / "docs"
        parser.add_argument("--parts", type=comma_list, default=list(PARTS),
                            help=f"what to measure, of {', '.join(PARTS)} (default: all); the others keep their "
                                 f"stored figures")
        parser.add_argument("--bugs", type=comma_list, help="comma-separated bug IDs (default: every runnable bug)")
        parser.add_argument("--folds", type=positive_int, default=3,
                            help=f"leave-one-out folds, at most {len(FOLD_ORDER)}, held out in the order "
                                 f"{', '.join(FOLD_ORDER)}")
        parser.add_argument("--pairs", type=positive_int, default=3, help="plain/TrainCheck overhead pairs")
        parser.add_argument("--concurrency", type=positive_int, default=2, help="runs at a time on the local worker")
        parser.add_argument("--evaluation", type=int, metavar="ID",
                            help="the stored evaluation of the benchmark's column (default: the latest, if any; "
                                 "without one the stored figures are kept)")
        parser.add_argument("--render-only", action="store_true",
                            help="measure nothing: refresh the benchmark's column and rewrite the Markdown")
        parser.add_argument("--rejudge", action="store_true",
                            help="with --render-only: judge the stored bugs' runs again from this database (after a "
                                 "change of the relevant relations), running nothing")
        parser.add_argument("--data", default=str(DATA_FILE), help="the figures (JSON)")
        parser.add_argument("--output", default=str(docs / "traincheck-paper.md"), help="the Markdown page")

    def handle(self, *args, **options):
        unknown = sorted(set(options["parts"]) - set(PARTS))
        if unknown or not options["parts"]:
            raise CommandError(f"--parts takes {', '.join(PARTS)}; not {', '.join(unknown) or 'nothing'}")
        if options["folds"] > len(FOLD_ORDER):
            raise CommandError(f"--folds is at most {len(FOLD_ORDER)} (one per clean pipeline)")
        data_path = Path(options["data"])
        data = self.stored(data_path)
        if not options["render_only"]:
            signal.signal(signal.SIGTERM, exit_on_sigterm)
            call_command("migrate", interactive=False, verbosity=0)
            call_command("load_catalog", verbosity=0)
            self.check_bugs(options["bugs"])
            data = self.measure(data, options, data_path)
        elif options["rejudge"]:
            data["detection"] = rejudge(data.get("detection", []))
        evaluation = self.evaluation(options["evaluation"])
        if evaluation is not None:
            data["benchmark"] = benchmark_figures(evaluation)
        self.save(data, data_path)
        Path(options["output"]).write_text(render(data), encoding="utf-8")
        self.stdout.write(f"Wrote {data_path} and {options['output']}")

    def check_bugs(self, bugs):
        runnable = {version.reproducer.bug.bug_id for version in runnable_versions(bugs)} if bugs else set()
        missing = sorted(set(bugs or ()) - runnable)
        if missing:
            raise CommandError(f"no runnable CPU reproducer for {', '.join(missing)}")

    def stored(self, path):
        if not path.exists():
            return {}
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as error:
            raise CommandError(f"{path} is not readable JSON: {error}") from error
        if not isinstance(data, dict):
            raise CommandError(f"{path} does not hold a JSON object")
        return data

    def save(self, data, path):
        path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n", encoding="utf-8")

    def evaluation(self, evaluation_id):
        if evaluation_id is None:
            return Evaluation.objects.filter(device=Device.CPU).first()  # the latest CPU one (Meta.ordering)
        evaluation = Evaluation.objects.filter(pk=evaluation_id).first()
        if evaluation is None:
            raise CommandError(f"No evaluation #{evaluation_id}.")
        return evaluation

    def measure(self, data, options, data_path):
        """Measure the parts asked for, saving the figures after each so that an interrupted run keeps the rest."""
        write = line_writer(sys.stdout)
        seconds, session_started = {}, time.monotonic()
        data.update({"measured_at": measured_at(), "commit": source_commit(), "torch": torch.__version__,
                     "traincheck": tool_version(),
                     "catalog_bugs": sorted({version.reproducer.bug.bug_id for version in runnable_versions()})})
        parts = options["parts"]
        if "detection" in parts or "false_positives" in parts:
            started = time.monotonic()
            detection, folds, campaigns = measure_runs(
                options["bugs"] if "detection" in parts else [],
                options["folds"] if "false_positives" in parts else 0, options["concurrency"], write)
            if "detection" in parts:  # the bugs measured now replace their earlier records, the others stay
                measured = {record["bug"] for record in detection}
                data["detection"] = sorted([record for record in data.get("detection", [])
                                            if record["bug"] not in measured] + detection,
                                           key=lambda record: record["bug"])
                data["campaigns"] = sorted(set(data.get("campaigns", [])) | set(campaigns))
            if "false_positives" in parts:
                data["false_positives"] = {"folds": folds, "campaigns": campaigns}
            seconds["runs"] = round(time.monotonic() - started, 1)
            self.save(data, data_path)
        if "overhead" in parts:
            started = time.monotonic()
            data["overhead"] = measure_overhead(options["pairs"], write)
            seconds["overhead"] = round(time.monotonic() - started, 1)
        # every measuring session, with its options and wall time: what the stored figures cost in all
        seconds["total"] = round(time.monotonic() - session_started, 1)
        data.setdefault("sessions", []).append({
            "at": data["measured_at"], "seconds": seconds,
            "options": {key: options[key] for key in ("parts", "bugs", "folds", "pairs", "concurrency")}})
        data["compute_seconds"] = {"total": round(sum(s["seconds"]["total"] for s in data["sessions"]), 1)}
        return data
