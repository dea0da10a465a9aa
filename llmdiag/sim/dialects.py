"""The simulator's dialects: which server's wire format one simulated engine speaks.

One simulated engine (``llmdiag.sim.engine``) can be served as vLLM (the default), or as another server whose pages
are rendered from the same state, so that every collector path of llmdiag can be tested live against the same
bottleneck. A dialect is data plus page builders:

    Dialect(
        name="sglang",                      # `llmdiag sim serve --dialect NAME`, SimServer(..., dialect=NAME)
        summary="SGLang 0.5 (--enable-metrics)",
        setup=build,                        # build(state: SimState) -> {GET path: Page}, called once per server
        headers={"server": "uvicorn"},      # added to every response of the server (what detection may read)
        owned_by="sglang",                  # /v1/models' owned_by
        metrics_path="/metrics",            # where a scraper finds the main metrics page (for SimServer.metrics_url)
    )
    register(dialect); get_dialect(name); dialect_names()

``setup`` runs once when the server starts and returns the dialect's GET routes; each ``Page`` is a zero-argument
callable returning ``(body bytes, content type)`` or ``(body, content type, status)``, evaluated at request time,
so a page built on a prometheus_client registry keeps one registry (and its ``_created`` stamps) for the server's
life. A page that raises ``PageUnavailable`` answers 404 with its message (a server without that endpoint). The
OpenAI routes (/v1/completions, /v1/chat/completions, /v1/models, /health, /tokenize), ``/dcgm/metrics`` and the
``/sim/*`` routes are the simulator's own and are served in every dialect; a dialect's route for the same path
replaces the default one (``/v1/models`` excepted: ``owned_by`` names the server there).

``SimState`` is what a page may read: the engine (``engine.stats``, ``running``, ``waiting``, ``kv_usage``,
``num_gpu_blocks``, ``free_blocks``, ``config``, ``dep``), the simulated clock (``clock()``, simulated seconds since
the start), ``wall_start`` (unix time of the start: every counter's ``_created``), the HTTP request counts and the
served model's name.

Dialect modules register themselves on import; ``get_dialect`` imports the known ones (``DIALECT_MODULES``) first,
so a new dialect is one module plus one line there. vLLM's dialect lives here; the others in
``llmdiag/sim/dialect_<name>.py``.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from llmdiag.errors import UsageError
from llmdiag.sim.engine import Engine
from llmdiag.sim.metrics import CONTENT_TYPE, HttpCounts, render, vllm_registry

JSON_CONTENT_TYPE = "application/json"
VLLM_VERSION = "0.33.0+llmdiag.sim"  # the vLLM release whose wire format the simulator speaks

PageResult = tuple[bytes, str] | tuple[bytes, str, int]
Page = Callable[[], PageResult]

# modules that register dialects when imported; the order is the order of `dialect_names()`
DIALECT_MODULES = (
    "llmdiag.sim.dialect_sglang",
    "llmdiag.sim.dialect_tgi",
    "llmdiag.sim.dialect_llamacpp",
    "llmdiag.sim.dialect_trtllm",
)


class PageUnavailable(Exception):
    """The dialect's server has no such page right now: answered 404 with the message."""


@dataclass(frozen=True)
class SimState:
    """What a dialect's pages read: one simulated server's engine, clock and counts."""

    engine: Engine
    clock: Callable[[], float]  # simulated seconds since the server started
    wall_start: float  # unix time the server started
    http: HttpCounts
    model: str
    model_len: int


@dataclass(frozen=True)
class Dialect:
    name: str
    summary: str
    setup: Callable[[SimState], Mapping[str, Page]]
    headers: Mapping[str, str] = field(default_factory=dict)
    owned_by: str = "vllm"
    metrics_path: str = "/metrics"


_REGISTRY: dict[str, Dialect] = {}
_loaded = False


def register(dialect: Dialect) -> Dialect:
    """Add (or replace) a dialect by name; returns it."""
    _REGISTRY[dialect.name] = dialect
    return dialect


def _load_modules() -> None:
    global _loaded
    if _loaded:
        return
    _loaded = True
    for module in DIALECT_MODULES:
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name != module:  # the module exists and something it imports does not: a real error
                raise


def dialect_names() -> list[str]:
    _load_modules()
    return list(_REGISTRY)


def get_dialect(name: str) -> Dialect:
    _load_modules()
    dialect = _REGISTRY.get(name.lower())
    if dialect is None:
        raise UsageError(f"unknown simulator dialect {name!r}", f"choose one of {', '.join(_REGISTRY)}")
    return dialect


def json_page(build: Callable[[], Any]) -> Page:
    """A page answering ``build()``'s value as JSON."""
    return lambda: (json.dumps(build()).encode(), JSON_CONTENT_TYPE)


def prometheus_page(registry: Any, content_type: str = CONTENT_TYPE) -> Page:
    """A page rendering a prometheus_client registry in the text format."""
    return lambda: (render(registry), content_type)


# --- vLLM (the default) ------------------------------------------------------------------------------------


def _vllm_pages(state: SimState) -> dict[str, Page]:
    registry = vllm_registry(state.engine, state.wall_start, state.http)

    def metrics() -> PageResult:
        state.http.add("/metrics", "GET", 200)
        return render(registry), CONTENT_TYPE

    return {"/metrics": metrics, "/version": json_page(lambda: {"version": VLLM_VERSION})}


VLLM = register(
    Dialect(
        name="vllm",
        summary=f"vLLM {VLLM_VERSION.split('+')[0]}",
        setup=_vllm_pages,
        headers={"server": "uvicorn"},
        owned_by="vllm",
    )
)


# --- hand-written exposition text (servers that do not use prometheus_client: TGI's Rust exporter, llama.cpp) ---


def _labels_text(labels: Mapping[str, str]) -> str:
    if not labels:
        return ""
    inner = ",".join(f'{k}="{v}"' for k, v in labels.items())
    return "{" + inner + "}"


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def text_family(name: str, kind: str, help_text: str, rows: list[tuple[Mapping[str, str], float]]) -> str:
    """One family in the text format as a non-Python exporter writes it: counters under their bare name."""
    lines = [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"] if help_text else [f"# TYPE {name} {kind}"]
    lines += [f"{name}{_labels_text(labels)} {_number(value)}" for labels, value in rows]
    return "\n".join(lines) + "\n"


def text_histogram(name: str, help_text: str, rows: list[tuple[Mapping[str, str], Any]]) -> str:
    """A histogram family from ``llmdiag.sim.engine.Histogram`` objects, one per label set."""
    lines = [f"# HELP {name} {help_text}"] if help_text else []
    lines.append(f"# TYPE {name} histogram")
    for labels, hist in rows:
        for bound, count in hist.cumulative():
            le = "+Inf" if bound == float("inf") else _number(bound)
            lines.append(f"{name}_bucket{_labels_text({**labels, 'le': le})} {count}")
        lines.append(f"{name}_sum{_labels_text(labels)} {_number(hist.total)}")
        lines.append(f"{name}_count{_labels_text(labels)} {hist.count}")
    return "\n".join(lines) + "\n"
