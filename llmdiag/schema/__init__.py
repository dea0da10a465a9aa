"""The data catalogue's schema: pydantic models and loaders for probes/ and rules/, validated on load.

A ground floor: it imports only llmdiag.model and llmdiag.errors.
"""
