"""The methodology: what the benchmark measures and how, in the words of the code that does it. The /methodology/
page and docs/methodology.md (``manage.py methodology``) are both rendered from ``sections()`` and
``detectors()``, whose text is the docstrings and constants that define each thing (evaluation.metrics, the
detector registry, ...), so that neither can drift from the code. Text that no code holds (what each bug
status means, the strategies, the oracle) is written here, once."""
import inspect
from dataclasses import dataclass

import sensitivity
from bugs.models import STRATEGIES, Bug, BugStatus, Reproducer, Reproduction
from core.enums import Variant
from core.markdown import markdown_html
from runners.detector_versions import fitting
from runners.detectors import campaign_plugins
from runners.detectors.base import DROP_IN, INTEGRATIONS, OPT_IN
from runners.models import StabilityCheck
from sensitivity import oracle as sensitivity_oracle

from . import held_out, integrity, leaderboard, metrics, overhead, tables


@dataclass(frozen=True)
class Section:
    slug: str
    title: str
    blocks: tuple  # Markdown: paragraphs, and lists whose items start with "* "
    sources: tuple  # where the code defines it


def doc(thing):
    """A docstring as Markdown (reStructuredText's ``code`` becomes `code`), one block per paragraph."""
    return tuple(inspect.getdoc(thing).replace("``", "`").split("\n\n"))


def term(name, thing):
    """``doc(thing)`` with its first paragraph led by the term it defines in bold."""
    first, *rest = doc(thing)
    return (f"**{name}.** {first}", *rest)


STATUS_MEANING = {
    BugStatus.SUBMITTED: "sent by a contributor and waiting for a maintainer's first approval; only its submitter "
                         "and the maintainers see it, and none of its code runs before that approval.",
    BugStatus.APPROVED: "a maintainer approved its reproducer; its verification is under way.",
    BugStatus.VERIFIED: "the verification's verdict: it reproduces on every seed, and its fix never shows the symptom.",
    BugStatus.FLAKY: "the verification's verdict: it reproduced, but not on every seed, or the fix showed it too, or "
                     "a run crashed.",
    BugStatus.UNREPRODUCIBLE: "the verification's verdict: the buggy variant never showed the symptom.",
    BugStatus.DEPRECATED: "retired by a maintainer, with a reason; it keeps its last verdict.",
}
STRATEGY_MEANING = {
    Reproduction.FAITHFUL: "the real library code hits the real bug on the torch version the benchmark runs.",
    Reproduction.INJECTED: "the faulty logic is rebuilt in a small training loop, because the bug is fixed upstream or "
                       "needs hardware the benchmark does not have.",
}
ORACLE = (
    "Every run of a reproducer ends with its **oracle** record: whether the silent error showed in this run "
    "(`manifested`) and the **trigger step**, the first training step at which the fault is active (the same number "
    "for both variants). The oracle checks the symptom itself (the numbers the training computes), not its cause, "
    "so that it is the ground truth whatever a detector looks at.",
    "The trigger step is the ground truth for detection: an alarm before it is a false alarm, and latency counts "
    "from it. Its time (`trigger_time`) is the time at which the trigger step began, for the latency in seconds.",
)
INTEGRATION = (
    "Every detector declares what it needs from the program it watches (its plugin's `integration`, checked when "
    "it is registered):",
    "\n".join(f"* **{label}**: {meaning}." for label, meaning in INTEGRATIONS.items()),
    f"`plain`, which runs the program with no detector, is {DROP_IN} and the baseline, never ranked. The headline "
    f"ranks the {DROP_IN} detectors among themselves; {OPT_IN} detectors are ranked apart, below them: a reproducer "
    "that computes its own reference comes close to being its own oracle, so what an opt-in detector catches is the "
    "reproducer's help as much as detection.",
)
CITATION = (
    "Cite a stored evaluation, never the live tables: its ID, the date it was stored, the environment it ran in "
    "(torch version, host) and the commit of the code. The /methodology/ page of a running SilentBench shows them "
    "for its latest evaluation, and the /leaderboard/ and /results/ pages say which evaluation their numbers come "
    "from. An evaluation's tables are stored when it finishes, so they do not change as more runs land.",
)


TASK = (
    "SilentBench measures how well error detectors catch **silent training errors**: bugs where training runs to the "
    "end and quietly computes the wrong thing. Each catalogued bug has a reproducer with a **buggy** and a **fixed** "
    "variant and an oracle that says whether the symptom showed; every detector runs on both variants of every bug "
    "over several seeds, and on clean reference pipelines.",
    "A detector is ranked by the **bugs it catches beyond the fixed twin**: an alarm on the buggy run, at or after "
    "the step where the fault becomes active, whose rule did not also fire on the fixed run of the same seed. It is "
    "read beside its **false-positive rate** on clean runs, with a Wilson 95 % interval, its latency and its "
    "overhead. Drop-in detectors, which need nothing from the program, are ranked among themselves; opt-in ones, "
    "which the reproducer helps, apart.",
)
EXAMPLE_TRIGGER = 5
# One bug, one detector, three seeds: (seed, the buggy run's alarms, its fixed twin's alarms), as (step, rule).
EXAMPLE_RUNS = (
    (0, ((7, "loss_spike"),), ()),
    (1, ((6, "grad_norm"),), ((3, "grad_norm"),)),
    (2, ((2, "loss_spike"),), ()),
)


def worked_example():
    """The terms on three runs, judged by the functions that judge every run (so the example cannot drift)."""
    def alarms(points):
        return [metrics.AlarmPoint(step, rule=rule) for step, rule in points]

    def shown(points):
        return ", ".join(f"`{rule}` at step {step}" for step, rule in points) or "none"

    rows, detected, beyond, clean_alarmed = [], 0, 0, 0
    for seed, buggy, fixed in EXAMPLE_RUNS:
        verdict = metrics.judge_run(Variant.BUGGY, EXAMPLE_TRIGGER, None, alarms(buggy))
        clean = metrics.judge_run(Variant.FIXED, EXAMPLE_TRIGGER, None, alarms(fixed))
        beyond_fixed = metrics.detected_beyond_clean(EXAMPLE_TRIGGER, alarms(buggy), {rule for _, rule in fixed})
        detected, beyond = detected + verdict.detected, beyond + beyond_fixed
        clean_alarmed += clean.any_false_alarm
        outcome = ("detected" if verdict.detected else "missed") + (
            f", {verdict.false_alarms} false alarm before the trigger" if verdict.false_alarms else "")
        rows.append(f"| {seed} | {shown(buggy)} | {shown(fixed)} | {outcome} | {'yes' if beyond_fixed else 'no'} |")
    low, high = metrics.wilson_interval(clean_alarmed, len(EXAMPLE_RUNS))
    return (
        f"A worked example: one bug whose fault becomes active at step {EXAMPLE_TRIGGER}, one detector, three seeds.",
        "\n".join(["| seed | buggy run's alarms | fixed twin's alarms | buggy run | beyond the fixed twin |",
                   "|---|---|---|---|---|", *rows]),
        f"* **Detected**: {detected} of {len(EXAMPLE_RUNS)} buggy runs have an alarm at or after step "
        f"{EXAMPLE_TRIGGER}; seed 2's alarm came before it, a false alarm, and the run is missed.\n"
        f"* **Beyond the fixed twin**: {beyond} of them; at seed 1 the fixed run raised the same rule, so that "
        "detection does not tell the bug from its fix. The bug counts as caught beyond the fixed twin (one seed "
        "suffices), and as caught.\n"
        f"* **False-positive rate**: {clean_alarmed} of {len(EXAMPLE_RUNS)} clean (fixed) runs alarmed: "
        f"{clean_alarmed / len(EXAMPLE_RUNS):.2f}, Wilson 95 % interval [{low:.3f}, {high:.3f}]. Three runs say "
        "little: the interval spans most of the range.",
    )


def sections():
    """The methodology's sections, in reading order."""
    wilson_z = inspect.signature(metrics.wilson_interval).parameters["z"].default
    return (
        Section("task", "What SilentBench measures", TASK, ("evaluation/leaderboard.py", "evaluation/metrics.py")),
        Section("terms", "The terms on a worked example", worked_example(),
                ("evaluation/metrics.py: judge_run, detected_beyond_clean, wilson_interval",)),
        Section("lifecycle", "Bugs and their lifecycle", (
            *term("Bug", Bug),
            "\n".join(f"* **{status.label}**: {STATUS_MEANING[status]}" for status in BugStatus),
            *term("Stability check", StabilityCheck),
        ), ("bugs/models.py: Bug, BugStatus", "runners/models.py: StabilityCheck")),
        Section("reproducers", "Reproducers: faithful, injected and simulated", (
            *term("Reproducer", Reproducer), *term("Variants", Variant),
            "\n".join([*(f"* **{strategy.label}**: {STRATEGY_MEANING[strategy]}" for strategy in STRATEGIES),
                       f"* **Simulated** (with either strategy): {Reproducer.simulated.field.help_text}"]),
        ), ("bugs/models.py: Reproducer, Reproduction, STRATEGIES", "core/enums.py: Variant")),
        Section("oracle", "The oracle and the trigger step", ORACLE, ("docs/reproducer-protocol.md",)),
        Section("detection", "Detected, false alarm and beyond the fixed twin", (
            *doc(metrics), *term("Judging a run", metrics.judge_run),
            *term("Beyond the fixed twin", metrics.detected_beyond_clean), *term("Matrix cell", tables.cell_text),
        ), ("evaluation/metrics.py: judge_run, detected_beyond_clean", "evaluation/tables.py: cell_text")),
        Section("integration", "Drop-in and opt-in detectors", INTEGRATION,
                ("runners/detectors/base.py: INTEGRATIONS, DetectorPlugin.integration",)),
        Section("flakiness", "Flakiness", term("Flakiness table", tables.flakiness_table),
                ("evaluation/tables.py: flakiness_table",)),
        Section("false-positives", "False-positive rates and the Wilson interval", (
            *term("False-positive table", tables.false_positive_table),
            *term("Wilson interval", metrics.wilson_interval),
            f"The 95 % interval takes z = {wilson_z}.",
        ), ("evaluation/tables.py: false_positive_table", "evaluation/metrics.py: wilson_interval")),
        Section("latency", "Latency", term("Latency table", tables.latency_table),
                ("evaluation/tables.py: latency_table",)),
        Section("overhead", "Overhead pairs", (
            *doc(overhead), f"Warm-up steps left out of the step time: {overhead.WARM_UP_STEPS}.",
        ), ("evaluation/overhead.py",)),
        Section("fit", "The fit phase", (*doc(fitting), *term("Held-out references", fitting.is_fit_reference)),
                ("runners/detector_versions/fitting.py",)),
        Section("leaderboard", "The leaderboard", doc(leaderboard), ("evaluation/leaderboard.py",)),
        Section("honest-scores", "How scores stay honest", (
            *doc(integrity), *term("In time", metrics.in_time),
        ), ("evaluation/integrity.py", "evaluation/metrics.py: in_time", "docs/security.md")),
        Section("held-out-bugs", "Held-out bugs", doc(held_out), ("evaluation/held_out.py", "bugs/selectors.py")),
        Section("sensitivity", "The sensitivity track", (
            *doc(sensitivity), *term("The noise-calibrated oracle", sensitivity_oracle),
            f"The stated quantile is {sensitivity_oracle.DEFAULT_QUANTILE:g}.",
        ), ("sensitivity/__init__.py", "sensitivity/oracle.py", "docs/writing-a-fault-operator.md")),
    )


def detectors():
    """[(name, description, needs_fit, integration)] of every detector a campaign may name."""
    return [(name, plugin.description, plugin.needs_fit, plugin.integration)
            for name, plugin in campaign_plugins().items()]


def markdown_document():
    """docs/methodology.md."""
    parts = ["# SilentBench methodology\n",
             "Generated from the code's own definitions by `manage.py methodology`; do not edit by hand. "
             "The dashboard's /methodology/ page shows the same text.\n"]
    for section in sections():
        parts += [f"## {section.title}\n", *(f"{block}\n" for block in section.blocks),
                  f"_Defined in: {'; '.join(section.sources)}._\n"]
    parts.append("## Detectors\n")
    parts.append("\n".join(f"* `{name}` ({integration}{', fits first' if needs_fit else ''}): {description}"
                           for name, description, needs_fit, integration in detectors()) + "\n")
    parts += ["_Defined in: runners/detectors/, each plugin's `description` and `integration`._\n", "## How to cite\n",
              *(f"{block}\n" for block in CITATION)]
    return "\n".join(parts)


def to_html(block):
    """One block of ``sections()`` (a paragraph, or a list whose items start with "* ") as HTML."""
    return markdown_html(block, compact=True)
