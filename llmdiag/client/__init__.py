"""What users actually get: an async client for the OpenAI-compatible API, prompts of a chosen length, and bounded
load runners, all measured from the client side. By module:

    openai      OpenAIClient(base_url, ...): async context manager; ``complete()`` sends one /v1/completions or
                /v1/chat/completions request (SSE streaming or not) and returns a RequestResult; ``models()``,
                ``count_tokens()`` (vLLM's /tokenize). ClientOptions: its settings, for code that opens it later
    http1       the HTTP/1.1 and SSE connection under OpenAIClient (why it is its own: below)
    rxtime      the kernel's receive stamp of each read: when bytes reached the machine
    result      RequestResult: one request as the user saw it (TTFT, every inter-token gap, end-to-end time, tokens,
                HTTP status, and the error with its kind when it failed); RequestPlan: what to send next (prompt,
                max_tokens, chat, stream, ...)
    prompts     PromptFactory: prompts of a requested token length from random common words
    runners     closed_loop(), open_loop(): N users each sending its next request when the last ends, or Poisson
                arrivals, bounded by a duration and a request count; BackgroundLoad: either on its own event loop
                in a thread for sync code, shaped by a LoadShape and counted in a LoadTally; check_target: load goes
                to this machine unless allowed elsewhere
    endpoint    Connection: where and how to reach a server (URLs, headers, secrets); URLs normalised and redacted
    deadline    Deadline: the latest a request, a scan or a check may end (a context variable for a run's);
                call_within() runs a blocking read by it, shutting its sockets when it passes (a slow drip, DNS)

Why a small HTTP/1.1 client of its own instead of aiohttp or httpx: the cost and the accuracy of the per-token
path. Each SSE event is timestamped in ``data_received``, when the bytes come off the socket, not after a task
wake-up behind every other ready callback; and the event is looked at with a few ``bytes.find`` calls on the
received buffer (no copies, no JSON parsing) unless it is not a plain content event: only the final usage event, an
error event or something odd is parsed. Sockets are read into one preallocated buffer (``BufferedProtocol``), so a
read allocates nothing. Measured on a 2-core machine against a trivial SSE server in another process (300 streams,
an event every 20 ms): about 11 µs of CPU per streamed event in all, of which about 2 µs is this module's parsing
and the rest the event loop and the system calls; aiohttp reading the same streams with ``iter_any`` and one
``bytes.count`` per read took 25–32 µs, and httpx costs more than aiohttp. Connections are kept alive and reused,
one per request in flight (``max_connections`` caps them; 0: no cap). TLS goes through the standard ``ssl``
module. Proxies, redirects and compressed bodies are not supported (the client asks for ``identity``).

Failures are results, never exceptions: ``complete()`` returns a RequestResult whose ``error_kind`` is one of

    connect     the TCP connection or TLS handshake failed (refused, DNS, certificate, too many open files)
    http        the server answered a status other than 2xx (429, 503, 500, ...); the body's message is kept
    timeout     no bytes for ``timeout_seconds`` (while connecting, waiting for the answer, or mid-stream)
    stream      the answer broke: connection dropped mid-body, malformed HTTP or SSE, an error event inside the
                stream (its ``code`` in ``error_code``), a stream that ended without ``data: [DONE]``
    cancelled   the caller cancelled it (a runner does at its deadline); not an error of the server

and what was received before the failure is kept (token times, output tokens counted from the events, text size).

Timestamps come from ``time.monotonic()``, which on Linux is one clock for every process of the machine, so they can
be compared with a server's own (the simulator's ``/sim/timings``). Arrivals are the kernel's receive stamps of each
read (``llmdiag.client.rxtime``): when the bytes reached the machine, not when this process got round to them.
The API key is sent as a bearer token and appears in no error, result or repr.
"""
