"""Read a saved result back: a Verdict (``scan``/``analyze --json``, ``demo -o``), a LoadReport (``load -o``) or a
FleetReport (``scan URL1 URL2 … --json``).

The kind is told by its keys: a fleet report has ``"kind": "fleet"``, a verdict ``bottleneck``, a load report
``points``. Anything else, or a file that is not JSON, is an ``InputFileError``: one line saying what is wrong,
never a traceback.
"""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import ValidationError

from llmdiag.errors import InputFileError
from llmdiag.model.fleet import FleetReport
from llmdiag.model.load import LoadReport
from llmdiag.model.report import READABLE_SCHEMA_VERSIONS, SCHEMA_VERSION
from llmdiag.model.verdict import Verdict

RESULT_HINT = "give a file written by `llmdiag scan --json`, `llmdiag demo -o FILE` or `llmdiag load -o FILE`"
MAX_RESULT_BYTES = 256 * 2**20


def load_result(path: Path) -> Verdict | LoadReport | FleetReport:
    path = Path(path)
    try:
        if path.stat().st_size > MAX_RESULT_BYTES:
            raise InputFileError(f"{path} is larger than {MAX_RESULT_BYTES // 2**20} MiB", RESULT_HINT)
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputFileError(f"{path}: no such file", RESULT_HINT) from None
    except IsADirectoryError:
        raise InputFileError(f"{path} is a folder, not a result file", RESULT_HINT) from None
    except UnicodeDecodeError:
        raise InputFileError(f"{path} is not text (not a JSON result)", RESULT_HINT) from None
    except OSError as exc:
        raise InputFileError(f"cannot read {path}: {exc.strerror}", RESULT_HINT) from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputFileError(f"{path} is not JSON: {exc.msg} at line {exc.lineno}", RESULT_HINT) from None
    if not isinstance(data, dict):
        raise InputFileError(f"{path} holds JSON, but not an llmdiag result (no object at the top)", RESULT_HINT)
    version = data.get("schema_version")
    # "1" files still load: schema "2" only added a class, a window kind and fields with defaults
    if version is not None and str(version) not in READABLE_SCHEMA_VERSIONS:
        raise InputFileError(
            f"{path} has schema_version {version!r}; this llmdiag reads "
            + " and ".join(repr(v) for v in READABLE_SCHEMA_VERSIONS)
            + f" (writes {SCHEMA_VERSION!r})",
            "regenerate the result with this llmdiag version",
        )
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
