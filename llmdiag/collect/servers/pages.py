"""A server's metrics page: is it that server's, and its signals (TensorRT-LLM and llama.cpp through their
own modules)."""

from __future__ import annotations

from llmdiag.collect.exposition import Scrape
from llmdiag.collect.signals import build_signal_set
from llmdiag.errors import NotMetricsError, option
from llmdiag.model import SignalSet
from llmdiag.schema.probes import ProbeSpec


def page_off_hint(server: str) -> str | None:
    """A server detected by its other endpoints whose metrics page answers 404: the option that turns the page on
    (None: no such option for that server)."""
    hints = {
        "sglang": "SGLang serves /metrics only when started with --enable-metrics: restart it with that flag "
        f"(or give {option('metrics_url')} where its metrics are)",
        "llamacpp": "llama-server serves /metrics only when started with --metrics: restart it with that flag",
    }
    return hints.get(server)


def check_server(spec: ProbeSpec, scrape: Scrape, where: str, hint: str | None = None) -> None:
    if any(name.startswith(tuple(spec.detect_prefixes)) for name in scrape.names()):
        return
    if set(spec.legacy_names) & scrape.names():
        return  # an older release's names, too generic to detect the server by
    if getattr(scrape, "records", None) is not None:  # TensorRT-LLM's JSON iteration stats
        if spec.prometheus_path:
            return
        raise NotMetricsError(
            f"{where} is TensorRT-LLM's JSON iteration stats, not {spec.server} metrics",
            f"give {option('server')} trtllm",
        )
    sample = ", ".join(sorted({n.split("_")[0] for n in scrape.names()})[:5])
    raise NotMetricsError(
        f"{where} has Prometheus metrics but none from {spec.server} "
        f"(no '{spec.detect_prefixes[0]}*' names; saw {sample} …)",
        hint or f"is this a {spec.server} server? if its metrics are on another port, give {option('metrics_url')}",
    )


def build_server_signals(
    spec: ProbeSpec, scrapes: list[Scrape], where: str, origin: Scrape | None = None, live: bool = True
) -> SignalSet:
    """A server page's signals; TensorRT-LLM and Triton pages go through their own module (JSON, estimates)."""
    if spec.name in ("trtllm", "triton"):
        from llmdiag.collect.servers import trtllm

        return trtllm.build_server_signals(spec, scrapes, where, origin, live)
    signal_set = build_signal_set(spec, scrapes, where, origin=origin)
    if spec.name == "llamacpp":  # ITL from the generation counters (llmdiag/collect/llamacpp.py)
        from llmdiag.collect.servers.llamacpp import finish_llamacpp_signals

        finish_llamacpp_signals(signal_set)
    return signal_set
