"""Telemetry beside the server's own page: its GPUs (NVML on this machine, a dcgm-exporter page) and its host
(CPU and memory of the server's processes). Each is optional: missing telemetry is said in the coverage, never zero."""
