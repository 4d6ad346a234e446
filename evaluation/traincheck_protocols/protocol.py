"""The protocol's constants: the detector, the configs of its three parts, the folds, the paper's own claims,
and the JSON file that holds the measured figures."""
from django.conf import settings

DETECTOR = "traincheck"


DATA_FILE = settings.BASE_DIR / "docs" / "traincheck-protocols.json"  # the measured figures; the page renders them


CHECK_SEED = 0  # every checked run; the per-bug fit runs the fixed variant at DETECTION_CONFIG's fit_seed


# The paper's kind of reference for a bug: a clean run of the same pipeline
# (runners.detector_versions.fitting.reference_versions).
DETECTION_CONFIG = {"fit_on_self": True, "fit_seed": 1}


# Leave-one-out over the clean pipelines: each held-out pipeline is checked against a fit on all the others.
FALSE_POSITIVE_CONFIG = {"fit_pipelines": None}


# transformer-adamw first: the overhead workload must be held out of the fit it checks against
FOLD_ORDER = ("transformer-adamw", "ddp-gloo", "mlp-adam", "cnn-sgd-momentum", "lstm-lm", "autocast-bf16")


OVERHEAD_WORKLOAD = "transformer-adamw"  # the benchmark's overhead workload; its fold's fit is reused


DEPLOYED_FOR_OVERHEAD = 100


OVERHEAD_CONFIG = {**FALSE_POSITIVE_CONFIG, "deploy_top": DEPLOYED_FOR_OVERHEAD}


PARTS = ("detection", "false_positives", "overhead")


PAPER = {
    "detection": "18/20 bugs (the relevant invariant fires, read by a person)",
    "false_positives": "< 2 % per invariant (failed / deployed on a clean program), 5 references",
    "overhead": "< 11 % (x1.11) with 100 invariants checked selectively",
}
