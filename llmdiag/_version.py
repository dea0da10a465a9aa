"""The version, stamped once: pyproject.toml and every report read it from here."""

__version__ = "0.1.0"
