"""What every report shares: the schema version of the JSON that llmdiag writes (a public interface), and the
version of the llmdiag that wrote it.

A report model inherits ``Report`` (or ``Versioned``, for a report that is a pure function of its inputs and so
names no tool version: ``llmdiag capacity``), so its JSON starts with those keys in that order and ``tool_version``
is stamped once, here, when the report is made. A report read back from a file keeps the version that wrote it.
"""

from __future__ import annotations

from pydantic import BaseModel

from llmdiag._version import __version__

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
