"""Data package: probe specs (TOML). Read with importlib.resources, never imported for code."""
