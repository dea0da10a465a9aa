"""Data package: report templates and assets. Read with importlib.resources."""
