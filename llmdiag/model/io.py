"""Read a saved result back: a Verdict (``scan``/``analyze --json``, ``demo -o``), a LoadReport (``load -o``) or a
FleetReport (``scan URL1 URL2 … --json``).

The kind is told by its keys: a fleet report has ``"kind": "fleet"``, a verdict ``bottleneck``, a load report
``points``. Anything else, or a file that is not JSON, is an ``InputFileError``: one line saying what is wrong,
never a traceback.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import ValidationError

from llmdiag.errors import InputFileError
from llmdiag.model.fleet import FleetReport
from llmdiag.model.load import LoadReport
from llmdiag.model.report import read_json_object
from llmdiag.model.verdict import Verdict

RESULT_HINT = "give a file written by `llmdiag scan --json`, `llmdiag demo -o FILE` or `llmdiag load -o FILE`"
MAX_RESULT_BYTES = 256 * 2**20


def load_result(path: Path) -> Verdict | LoadReport | FleetReport:
    data = read_json_object(Path(path), MAX_RESULT_BYTES, RESULT_HINT, what="an llmdiag result")
    if data.get("kind") == "fleet":
        model: type[Verdict] | type[LoadReport] | type[FleetReport] = FleetReport
    elif "bottleneck" in data:
        model = Verdict
    elif "points" in data:
        model = LoadReport
    else:
        raise InputFileError(
            f"{path} holds JSON, but not an llmdiag result (neither 'bottleneck' nor 'points' at the top)",
            RESULT_HINT,
        )
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "(top)"
        raise InputFileError(
            f"{path} is not a valid {model.__name__}: {where}: {first['msg']} ({exc.error_count()} problem(s))",
            RESULT_HINT,
        ) from None
