"""The built-in model of an inference server: hardware and model tables (``hardware``), the step-time and
KV-cache physics (``physics``), and the simulator built on them. ``llmdiag.engine.capacity`` reuses the physics.
"""
