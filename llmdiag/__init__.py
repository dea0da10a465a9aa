"""llmdiag: tells you why your LLM inference server is slow."""

__version__ = "0.1.0"

from llmdiag.api import diagnose, diagnose_files, run_load  # noqa: E402

__all__ = ["__version__", "diagnose", "diagnose_files", "run_load"]
