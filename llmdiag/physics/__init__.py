"""The physics of LLM serving: GPU and model tables, KV capacity, and the step-time (roofline) model.

A ground floor shared by the capacity planner (llmdiag.engine.capacity) and the simulator (llmdiag.sim).
"""
