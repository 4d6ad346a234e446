"""Helpers shared by several test modules (test modules import from here and from factories.py, never
from each other)."""
import os
import re
from html.parser import HTMLParser

import yaml
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import URLPattern, URLResolver
from django.utils.html import strip_tags
from rest_framework.test import APIClient

from accounts.actions import do_create_api_token
from bugs.models import Bug
from evaluation.actions import do_store_evaluation
from runners.actions.detectors import do_record_detector

from .factories import (
    GOOD_REPRODUCER,
    AlarmFactory,
    BugFactory,
    CampaignFactory,
    EnvironmentFactory,
    ReproducerFactory,
    ReproducerVersionFactory,
    RunFactory,
    StabilityCheckFactory,
)

# Text that would run as script if a page, export or plot forgot to escape it.
HOSTILE = "<script>alert('pwned')</script>"


# --- API clients ---

def client_for(user=None):
    """An API client, anonymous or authenticated by a fresh named token of ``user``."""
    client = APIClient()
    if user is not None:
        client.credentials(HTTP_AUTHORIZATION=f"Token {do_create_api_token('test', acting_user=user)[1]}")
    return client


# --- Pages ---

def url_names(patterns, namespace=None):
    """Every URL name the site resolves ("namespace:name"); the admin's as one namespace, "admin:*"."""
    for pattern in patterns:
        if isinstance(pattern, URLResolver):
            inner = pattern.namespace or namespace
            if inner == "admin":
                yield "admin:*"
            else:
                yield from url_names(pattern.url_patterns, inner)
        elif isinstance(pattern, URLPattern):
            yield f"{namespace}:{pattern.name}" if namespace else pattern.name


class _Tables(HTMLParser):
    """The cell texts of one table of a page, by id."""

    def __init__(self, table_id):
        super().__init__()
        self.table_id, self.inside, self.rows, self.cell = table_id, False, [], None

    def handle_starttag(self, tag, attrs):
        if tag == "table" and dict(attrs).get("id") == self.table_id:
            self.inside = True
        elif self.inside and tag == "tr":
            self.rows.append([])
        elif self.inside and tag in ("td", "th"):
            self.cell = ""

    def handle_endtag(self, tag):
        if tag == "table":
            self.inside = False
        elif self.inside and tag in ("td", "th") and self.cell is not None:
            self.rows[-1].append(" ".join(self.cell.split()))
            self.cell = None

    def handle_data(self, data):
        if self.cell is not None:
            self.cell += data


def table(page, table_id):
    """[{header: cell text}] of the table with this id."""
    parser = _Tables(table_id)
    parser.feed(page)
    header, *rows = parser.rows
    return [dict(zip(header, row)) for row in rows]


def latex_rows(text):
    """The body rows of a booktabs table as {column: cell}, unescaped."""
    lines = text.splitlines()
    header = lines[lines.index(r"\toprule") + 1]
    body = lines[lines.index(r"\midrule") + 1:lines.index(r"\bottomrule")]

    def cells(line):
        return [cell.strip().replace("\\_", "_") for cell in line.rstrip().removesuffix("\\\\").split(" & ")]

    columns = cells(header)
    return [dict(zip(columns, cells(line))) for line in body]


def matrix_cells(page):
    """{(bug, detector): (outcome, "detected/buggy")} as the results page shows them (a Playwright page)."""
    return {tuple(key): tuple(value) for key, value in page.eval_on_selector("#detection-matrix", """table => {
        const detectors = [...table.querySelectorAll("thead th")].slice(1).map(th => th.textContent.trim());
        const cells = [];
        for (const row of table.querySelectorAll("tbody tr")) {
            const bug = row.querySelector("td a").textContent.trim();
            row.querySelectorAll("td.cell").forEach((td, i) => {
                const badge = td.querySelector(".badge");
                if (badge) cells.push([[bug, detectors[i]],
                    [badge.textContent.trim(), td.querySelector(".muted").textContent.trim().split(" ")[0]]]);
            });
        }
        return cells;
    }""")}


# --- Runs ---

def make_runs(bug_title="A test bug", rule="no_parameter_updated", campaign=None, environment=None):
    """Two bugs x (param_not_updated, plain): a detection with latency 2, a pre-trigger false alarm,
    a clean run with an alarm; the second bug's cuda reproducer is detected at latency 4."""
    first = ReproducerVersionFactory(reproducer=ReproducerFactory(bug=BugFactory(bug_id="TEST-A", title=bug_title)))
    second_bug = BugFactory(bug_id="TEST-B", framework="deepspeed", fault_location="framework")
    second = ReproducerVersionFactory(reproducer=ReproducerFactory(bug=second_bug))
    cuda = ReproducerVersionFactory(reproducer=ReproducerFactory(bug=second_bug, name="cuda"))
    guard, plain = do_record_detector("param_not_updated"), do_record_detector("plain")

    def run(version, detector, variant, alarm_steps=(), seed=0, manifested=None):
        made = RunFactory(reproducer_version=version, detector=detector, variant=variant, status="succeeded",
                          steps=10, trigger_step=3, trigger_time=100.0, seed=seed, campaign=campaign,
                          environment=environment,
                          manifested=(variant == "buggy") if manifested is None else manifested,
                          step_records=[{"step": s, "rank": 0, "loss": 1.0, "time": 100.0 + s} for s in range(10)])
        for step in alarm_steps:
            AlarmFactory(run=made, step=step, rule=rule, message=HOSTILE, time=100.0 + step)
        return made

    return {
        "detected": run(first, guard, "buggy", [5]),
        "detected_seed_1": run(first, guard, "buggy", [3], seed=1),
        "clean": run(first, guard, "fixed"),
        "early": run(second, guard, "buggy", [1]),
        "clean_fp": run(second, guard, "fixed", [4]),
        "cuda": run(cuda, guard, "buggy", [7]),
        "plain_buggy": run(first, plain, "buggy"),
        "plain_fixed": run(first, plain, "fixed"),
    }


# --- Submissions ---

# What a bug's reproducer.yaml must say about its oracle and its distance from the upstream report.
ORACLE_AND_FIDELITY = {"oracle": {"symptom": "loss", "check": "The final loss is above 1.0."},
                       "fidelity_note": "Upstream: a ResNet on ImageNet on GPUs; here a linear model on CPU, 4 steps."}
SUBMISSION_MANIFEST = {"entrypoint": "repro.py", "strategy": "injected", "default_steps": 4,
                       "needs": {"cuda": False, "world_size": 1, "time_limit_seconds": 30, "memory_mb": 1024},
                       **ORACLE_AND_FIDELITY}
# A valid reproducer folder and the bug form that submits it.
FILES = {"repro.py": GOOD_REPRODUCER, "reproducer.yaml": yaml.safe_dump(SUBMISSION_MANIFEST)}
BUG_FORM = {"bug_id": "GH-4242", "title": "Gradients silently dropped", "framework": "pytorch",
            "fault_location": "user", "root_cause": "A detach in the wrong place.", "symptom": "Loss plateaus.",
            "reproduction": "injected", "reproducer_name": "cpu"}


def uploads(files):
    """{name: text} as uploaded files."""
    return [SimpleUploadedFile(name, text.encode()) for name, text in files.items()]


# --- Processes ---

def is_running(pid):
    """Alive and not a zombie (an orphan's zombie waits for init, which may not reap here)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def processes_naming(word):
    """The host PIDs of the processes whose command line contains ``word`` (a token a test gave them)."""
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/cmdline", "rb") as cmdline:
                    if word.encode() in cmdline.read():
                        found.append(int(entry.name))
            except OSError:
                continue
    return found


def stored_evaluation(bundled=False, environment=None, bugs=("PUB-1", "PUB-2"), device="cpu", reproducer="cpu",
                      verdicts=("verified", "verified"), **parameters):
    """A stored evaluation of two bugs under two drop-in detectors and the opt-in ``differential``: nan_inf catches
    both, grad_health one (with a false alarm on every fixed run), differential both; a failed run, a stability
    check per bug. ``bundled``: nan_inf and grad_health watch each run together, in one bundle's run (their alarms
    name them), as ``manage.py evaluate --cuda`` runs them. ``environment``: the runs' (default: a CPU host's);
    ``bugs``: the two bugs' IDs (existing ones are reused), each with a ``reproducer`` of that name, whose stability
    checks give ``verdicts``; ``device``: where the runs ran; ``parameters`` join the evaluation's."""
    trigger = 3
    campaign = CampaignFactory(name="evaluation", purpose="evaluation")
    environment = environment or EnvironmentFactory(host="eval-host", torch="2.13.0+cpu")
    bundle = do_record_detector("bundle", {"detectors": ["nan_inf", "grad_health"], "code": {}})
    for bug_id, verdict in zip(bugs, verdicts, strict=True):
        bug = Bug.objects.filter(bug_id=bug_id).first() or BugFactory(bug_id=bug_id)
        version = ReproducerVersionFactory(reproducer=ReproducerFactory(bug=bug, name=reproducer))
        StabilityCheckFactory(reproducer_version=version, verdict=verdict)
        for variant in ("buggy", "fixed"):
            runs = {}
            for detector in ("nan_inf", "grad_health", "differential"):
                if bundled and detector in bundle.config["detectors"] and runs:
                    runs[detector] = runs["nan_inf"]
                    continue
                runs[detector] = RunFactory(
                    campaign=campaign, reproducer_version=version, variant=variant, steps=10, trigger_step=trigger,
                    detector=bundle if bundled and detector == "nan_inf" else do_record_detector(detector),
                    trigger_time=100.0, manifested=variant == "buggy", status="succeeded", environment=environment,
                    step_records=[{"step": 0, "rank": 0, "loss": 1.5, "time": 99.0}])
            for detector, run in runs.items():
                member = detector if run.detector_id == bundle.pk else ""
                if variant == "buggy" and (bug_id, detector) != (bugs[1], "grad_health"):
                    AlarmFactory(run=run, step=trigger + 1, rule=f"{detector}_rule", time=101.0, arrival_step=4,
                                 detector=member)
                if variant == "fixed" and detector == "grad_health":
                    AlarmFactory(run=run, step=1, rule="grad_health_noise", time=98.0, detector=member)
    RunFactory(campaign=campaign, detector=do_record_detector("nan_inf"), status="failed",
               failure_reason="it crashed", reproducer_version=version, variant="buggy", seed=1, steps=10)
    return do_store_evaluation(campaign, None, [{"detector": "nan_inf", "median_step_time_ratio": 1.02}], [],
                               {"seeds": 1, "commit": "abc123", "host": "eval-host", **parameters}, 12.5,
                               device=device, acting_user=None)


def said(html, element_id):
    """The text of the element with this id, its white space collapsed."""
    return " ".join(strip_tags(re.search(rf'<(\w+)[^>]* id="{element_id}".*?</\1>', html, re.S)[0]).split())
