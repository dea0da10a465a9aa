"""The built-in model of an inference server, run behind vLLM's HTTP API so that every probe can be tested and shown
against it. The hardware tables and step-time physics live in ``llmdiag.physics``; here:

    engine       a vLLM-V1-style continuous-batching engine, stepped by hand (no clock, no sockets)
    realtime     the engine run in (scaled) real time on an event loop, waking requests as tokens come out
    openai       the OpenAI API as vLLM speaks it: prompt token counts, the output text, SSE events, error bodies
    app          the aiohttp application: the OpenAI routes, /tokenize, the dialect's pages, /sim/stats, /sim/timings
    timings      server-side timings (when each request arrived and each event was written), arrival stamping
    server       SimServer: the app on its own event loop in a thread, its port, switching presets in place
    load         ClosedLoopLoad and run_for: a preset's bounded closed-loop load (the client's BackgroundLoad)
    presets      named states (healthy, memory, compute, scheduling, network): a setup and the load that shows it
    metrics      vLLM's Prometheus page and dcgm-exporter's, rendered from the engine
    dialects     other servers' pages from the same engine (dialect_sglang, dialect_tgi, dialect_llamacpp,
                 dialect_trtllm)
"""
