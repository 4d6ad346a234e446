"""Inside a sandbox: run one offline hook (``analyze`` or ``fit``) of a submitted detector and write its answer as
JSON. Started by runners.detector_versions.submitted as ``python -I runners/detector_versions/host.py REQUEST``: the
request (JSON) names the module (the stored source, written into the run directory), the hook's arguments and where
the answer goes. The worker reads that answer as JSON and checks it; an exception becomes ``{"error": traceback}``.

Imports no Django: only the package folder ``runners/`` is in the sandbox's view, besides the interpreter.
"""
import json
import sys
import traceback
import types
from pathlib import Path


def answer(request):
    from runners.detectors.base import RunContext, load_submitted_plugin
    from runners.executor import Limits

    plugin = load_submitted_plugin(request["module"])
    limits = Limits(**request["limits"])
    if request["hook"] == "analyze":
        given = request["context"]
        context = RunContext(workdir=Path(given["workdir"]), entrypoint=given["entrypoint"], config=given["config"],
                             env=request["env"], limits=limits, fit_artifact=given["fit_artifact"])
        # What the worker passes of the run's report (runners.detector_versions.submitted.detector_report): start
        # (without variant and seed), steps, alarms (the probe's, signed) and comparisons; never the oracle.
        alarms = plugin.analyze(context, types.SimpleNamespace(**request["report"]))
        return {"alarms": alarms, "summary": context.summary}
    programs = [(Path(directory), entrypoint, list(args)) for directory, entrypoint, args in request["programs"]]
    content, summary = plugin.fit(programs, Path(request["workdir"]), request["env"], limits, request["config"])
    return {"content": content, "summary": summary}


def main(request_path):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # where ``runners`` is (-I leaves the folder out)
    request = json.loads(Path(request_path).read_text(encoding="utf-8"))
    try:
        result = answer(request)
    except Exception:  # noqa: BLE001 - the worker reports it as the detector's failure
        result = {"error": traceback.format_exc()[-4000:]}
    Path(request["answer"]).write_text(json.dumps(result, default=str), encoding="utf-8")


if __name__ == "__main__":
    main(sys.argv[1])
