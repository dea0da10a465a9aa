"""llama.cpp's ``llama-server``: what its /metrics page gives only indirectly, derived here and said so.

The page has no latency histograms and, in builds since mid-2025 (PR #13660), no KV-cache gauge (metrics catalog §5).
What llmdiag derives, never guesses:

    itl_seconds          mean only: Δ ``tokens_predicted_seconds_total`` / Δ ``tokens_predicted_total`` (``llamacpp:``).
                         llama.cpp adds a request's generation time (its slot's wall time from first to last token)
                         and its generated tokens when the request ends, so the ratio is the mean time per output token
                         of the requests that ended in the window (catalog §7: "predicted seconds ÷ tokens"); no
                         percentiles. Unavailable when no request ended in the window.
    max_active_requests  ``total_slots`` of ``GET /props`` (the --parallel slots), live scans only: llama.cpp defers a
                         request only when no slot is free, so requests deferred with every slot busy is the slot
                         limit (SCH010); deferred requests with free slots is something else, which the page cannot name
    slot_context_tokens  ``default_generation_settings.n_ctx`` of /props: each slot's context (KV) in tokens

The KV gauge itself (``llamacpp:kv_cache_usage_ratio``, with ``llamacpp:kv_cache_tokens``) is read where an older build
has it (probes/llamacpp.toml); a recent build's is unavailable with the reason, and memory is then not judged.
"""

from __future__ import annotations

import json

from llmdiag.client.endpoint import Connection, redact_url
from llmdiag.collect.tape import taped_value
from llmdiag.model import Signal, SignalSet

PROPS_PATH = "/props"
PROPS_TIMEOUT_SECONDS = 3.0
MAX_PROPS_BYTES = 1024 * 1024
ITL_SOURCE = (
    "derived: Δ llamacpp:tokens_predicted_seconds_total / Δ llamacpp:tokens_predicted_total (generation time summed "
    "over slots per generated token, added when each request ends: the mean time per output token; no percentiles)"
)
NO_PROPS = "a saved /metrics page does not carry the slot count (GET /props: total_slots)"


def finish_llamacpp_signals(signal_set: SignalSet) -> None:
    """``itl_seconds`` from the generation counters; the slot count unavailable until /props is read."""
    if signal_set.get("itl_seconds") is None:
        signal_set.add(_itl(signal_set))
    for name, unit in (("max_active_requests", "requests"), ("slot_context_tokens", "tokens")):
        if signal_set.get(name) is None:
            signal_set.add(Signal.missing(name, "info", unit, NO_PROPS))


def _itl(signal_set: SignalSet) -> Signal:
    busy, tokens = signal_set.get("generation_busy_seconds_per_second"), signal_set.get("generation_tokens_per_second")
    for counter in (busy, tokens):
        if counter is None or counter.unavailable is not None:
            why = counter.unavailable if counter is not None else "not collected"
            return Signal.missing(
                "itl_seconds",
                "histogram",
                "seconds",
                f"llama.cpp has no latency histogram and its generation counters are missing: {why}",
            )
    assert busy is not None and tokens is not None
    seconds, generated = busy.stats.get("rate"), tokens.stats.get("rate")
    if not generated or seconds is None:
        return Signal.missing(
            "itl_seconds",
            "histogram",
            "seconds",
            "no request ended in the window (llama.cpp counts a request's generated tokens and "
            "generation time when it ends)",
        )
    window = tokens.window_seconds
    count = tokens.stats.get("increase", generated * (window or 0.0))
    return Signal(
        name="itl_seconds",
        kind="histogram",
        unit="seconds",
        stats={"mean": seconds / generated, "count": count},
        source=ITL_SOURCE,
        window_seconds=window,
        verify="curl -s URL/metrics | grep -E '^llamacpp:tokens_predicted(_seconds)?_total'  # twice, "
        "then Δseconds / Δtokens",
    )


def read_props(connection: Connection) -> list[Signal]:
    """The slot count and each slot's context from ``GET /props``; unavailable signals with the reason otherwise.
    One read, within its timeout and the scan's deadline."""
    url = connection.base_url.rstrip("/") + PROPS_PATH
    body, why = taped_value(  # recorded into a bundle, or replayed from one
        f"value {redact_url(url)}",
        lambda: _get_props(connection, url),
        lambda answer: {"body": answer[0], "why": answer[1]},
        lambda value: (value["body"], str(value["why"])),
    )
    return props_signals(body, why)


def _get_props(connection: Connection, url: str) -> tuple[object, str]:
    from llmdiag.client.deadline import deadline_session
    from llmdiag.collect.http import get_small
    from llmdiag.errors import ProbeError

    session = deadline_session()
    session.headers.update({"User-Agent": "llmdiag", **connection.headers})
    if connection.api_key:
        session.headers["Authorization"] = f"Bearer {connection.api_key}"
    session.verify = not connection.insecure
    why = ""
    body: object = None
    try:
        answer = get_small(session, url, min(connection.timeout_seconds, PROPS_TIMEOUT_SECONDS), MAX_PROPS_BYTES)
        if answer.status != 200:
            why = f"GET {PROPS_PATH} answered HTTP {answer.status}"
        elif answer.too_large:
            why = f"GET {PROPS_PATH} answered more than {MAX_PROPS_BYTES // 1024} KiB"
        else:
            body = json.loads(answer.body)
    except ProbeError as exc:
        why = f"GET {PROPS_PATH} failed: {exc.message}"
    except ValueError:
        why = f"GET {PROPS_PATH} did not answer JSON"
    finally:
        session.close()
    return body, why


def props_signals(body: object, why: str = "") -> list[Signal]:
    """The slot count and each slot's context from a ``/props`` answer already read (``why``: why it could not be)."""
    if not isinstance(body, dict):
        why = why or f"GET {PROPS_PATH} did not answer a JSON object"
        return [
            Signal.missing("max_active_requests", "info", "requests", why),
            Signal.missing("slot_context_tokens", "info", "tokens", why),
        ]
    slots = body.get("total_slots")
    settings = body.get("default_generation_settings")
    n_ctx = settings.get("n_ctx") if isinstance(settings, dict) else None
    source = f"llama.cpp {PROPS_PATH}"
    verify = f"curl -s URL{PROPS_PATH} | python3 -m json.tool | grep -E 'total_slots|n_ctx'"
    out = []
    for name, unit, value, key in (
        ("max_active_requests", "requests", slots, "total_slots"),
        ("slot_context_tokens", "tokens", n_ctx, "default_generation_settings.n_ctx"),
    ):
        if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
            out.append(
                Signal(
                    name=name,
                    kind="info",
                    unit=unit,
                    stats={"value": float(value), "last": float(value)},
                    source=f"{source}: {key}",
                    verify=verify,
                )
            )
        else:
            out.append(Signal.missing(name, "info", unit, f"{PROPS_PATH} has no {key}", source=source))
    return out
