"""Data package: one TOML file per rule. Read with importlib.resources, never imported for code."""
