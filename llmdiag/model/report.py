"""What every report shares: the schema version of the JSON that llmdiag writes (a public interface), and the
version of the llmdiag that wrote it.

A report model inherits ``Report`` (or ``Versioned``, for a report that is a pure function of its inputs and so
names no tool version: ``llmdiag capacity``), so its JSON starts with those keys in that order and ``tool_version``
is stamped once, here, when the report is made. A report read back from a file keeps the version that wrote it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from llmdiag._version import __version__
from llmdiag.errors import InputFileError

# "2": the verdict class "stalled", Finding.stall, Verdict.class_confidence and the window kind "snapshot"
# (Verdict.confidence_factors came later, optional: an addition a "2" reader may ignore, so still "2")
# "3": Verdict.whatif_inputs (what `llmdiag whatif` predicts from) and Finding.predicted (each fix's effect)
SCHEMA_VERSION = "3"
# versions this llmdiag still reads back: a "1" file is a "2" file without the additions, a "2" a "3" without
# them (llmdiag.model.io)
READABLE_SCHEMA_VERSIONS = ("1", "2", "3")


class Versioned(BaseModel):
    schema_version: str = SCHEMA_VERSION


class Report(Versioned):
    tool_version: str = __version__


def read_json_object(
    path: Path, max_bytes: int, hint: str, check_version: bool = True, what: str = "an object"
) -> dict[str, Any]:
    """The JSON object in ``path`` (a saved report, workload or prediction); anything else (missing, a folder, not
        JSON, a list, a schema version this llmdiag does not read) is one InputFileError with ``hint``; ``what`` names
    what the file should hold ("an llmdiag result")."""
    try:
        if path.stat().st_size > max_bytes:
            raise InputFileError(f"{path} is larger than {max_bytes // 2**20} MiB", hint)
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputFileError(f"{path}: no such file", hint) from None
    except IsADirectoryError:
        raise InputFileError(f"{path} is a folder, not a file", hint) from None
    except UnicodeDecodeError:
        raise InputFileError(f"{path} is not text (not JSON)", hint) from None
    except OSError as exc:
        raise InputFileError(f"cannot read {path}: {exc.strerror}", hint) from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputFileError(f"{path} is not JSON: {exc.msg} at line {exc.lineno}", hint) from None
    except RecursionError:
        raise InputFileError(f"{path} is JSON nested deeper than any llmdiag file", hint) from None
    if not isinstance(data, dict):
        raise InputFileError(f"{path} holds JSON, but not {what} (no object at the top)", hint)
    version = data.get("schema_version")
    if check_version and version is not None and str(version) not in READABLE_SCHEMA_VERSIONS:
        raise InputFileError(
            f"{path} has schema_version {version!r}; this llmdiag reads "
            + " and ".join(repr(v) for v in READABLE_SCHEMA_VERSIONS)
            + f" (writes {SCHEMA_VERSION!r})",
            "regenerate the file with this llmdiag version",
        )
    return data
