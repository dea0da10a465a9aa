"""What every report shares: the schema version of the JSON that llmdiag writes (a public interface)."""

from __future__ import annotations

SCHEMA_VERSION = "1"
