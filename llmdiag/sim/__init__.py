"""The built-in model of an inference server: hardware and model tables (``hardware``), step-time and KV-cache
physics (``physics``), a vLLM-V1-style continuous-batching engine (``engine``), its vLLM and DCGM pages
(``metrics``), the HTTP server and a closed-loop load driver (``server``), and named states (``presets``).
``llmdiag.engine.capacity`` reuses the physics.
"""
