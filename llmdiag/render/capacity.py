"""Render a CapacityReport: rich renderables for the terminal (the CLI prints them) and JSON."""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.padding import Padding
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from llmdiag.errors import option
from llmdiag.model import Bottleneck
from llmdiag.model.capacity import CapacityReport, OperatingPoint, Resource
from llmdiag.render.format import format_value, rate
from llmdiag.render.terminal import CLASS_STYLE

LABEL: dict[str, str] = {
    "kv_memory": "KV-cache memory",
    "max_num_seqs": "max_num_seqs",
    "max_num_batched_tokens": "max_num_batched_tokens",
    "compute": "compute",
    "hbm_bandwidth": "HBM bandwidth",
    "interconnect": "interconnect",
    "scheduler": "scheduler CPU",
}
# the verdict class each limit belongs to, so capacity and scan use the same colours
CLASS_OF: dict[Resource, Bottleneck] = {
    "kv_memory": Bottleneck.memory,
    "max_num_seqs": Bottleneck.scheduling,
    "max_num_batched_tokens": Bottleneck.scheduling,
    "compute": Bottleneck.compute,
    "hbm_bandwidth": Bottleneck.compute,
    "interconnect": Bottleneck.network,
    "scheduler": Bottleneck.scheduling,
}


def _gib(value: float) -> str:
    return f"{value / 1024**3:.1f} GiB"


def _seconds(value: float) -> str:
    return format_value(value, "seconds")


def _rate(value: float) -> str:
    return rate(value, whole_from=1000, below_one=".3g")


def _billions(value: int) -> str:
    return f"{value / 1e9:.2f} B"


def _context(report: CapacityReport) -> Text:
    i = report.inputs
    where = f"{i.tp} × {i.gpu_part}" if i.tp > 1 else f"one {i.gpu_part}"
    link = f" over {i.interconnect}" if i.tp > 1 else ""
    return Text(
        f"{i.model} ({i.model_source}) on {where}{link} · {i.users:,} users × "
        f"({i.prompt_tokens} prompt + {i.output_tokens} output tokens)",
        style="dim",
    )


def _headline(report: CapacityReport) -> RenderableType:
    line = Text()
    line.append(f" {LABEL[report.limited_by].upper()} ", style=CLASS_STYLE[CLASS_OF[report.limited_by]])
    return Group(line, Text(report.summary))


def _grid() -> Table:
    """Two-space indented rows whose last column wraps under itself, not under the margin."""
    return Table(box=None, show_header=False, padding=(0, 2, 0, 0), pad_edge=False)


def _indent(renderable: RenderableType) -> Padding:
    return Padding(renderable, (0, 0, 0, 2), expand=False)


def _memory(report: CapacityReport) -> RenderableType:
    m, i, model = report.memory, report.inputs, report.model
    table = _grid()
    table.add_column(no_wrap=True)
    table.add_column(justify="right", no_wrap=True)
    table.add_column(style="dim")
    table.add_row(
        f"usable ({_gib(report.hardware.memory_bytes)} × {i.gpu_memory_utilization:g})",
        _gib(m.usable_bytes_per_gpu),
        option("gpu_memory_utilization"),
    )
    params = f"{_billions(model.total_params)} params"
    if model.experts > 1:
        params += f" ({_billions(model.active_params)} active)"
    table.add_row(
        f"weights{f' ÷ TP {i.tp}' if i.tp > 1 else ''}",
        _gib(m.weight_bytes_per_gpu),
        f"{params} × {model.weight_bytes / model.total_params:.3g} bytes",  # 0.558 for MXFP4 experts
    )
    table.add_row("activation reserve", _gib(m.activation_reserve_bytes), "assumed (vLLM profiles it)")
    table.add_row(
        "KV cache",
        _gib(m.kv_cache_bytes_per_gpu),
        f"{m.kv_capacity_tokens:,} tokens × {m.kv_bytes_per_token_per_gpu:,} bytes",
    )
    table.add_row(
        f"largest batch at {m.context_tokens:,} tokens",
        f"{m.kv_max_batch_sequences:,}",
        f"{m.blocks_per_sequence} of {m.kv_blocks:,} blocks each",
    )
    return _indent(table)


def _throughput(report: CapacityReport) -> RenderableType:
    table = Table(box=None, header_style="dim", padding=(0, 2, 0, 0), pad_edge=False)
    table.add_column("")
    table.add_column("batch", justify="right", no_wrap=True)
    table.add_column("step", justify="right", no_wrap=True)
    table.add_column("limited by", no_wrap=True)
    table.add_column("tok/s each", justify="right", no_wrap=True)
    table.add_column("tok/s total", justify="right", no_wrap=True)

    def row(point: OperatingPoint, label: str) -> None:
        table.add_row(
            label,
            f"{point.batch_sequences:,}",
            _seconds(point.step.step_seconds),
            LABEL[point.step.bound_by],
            _rate(point.per_user_tokens_per_second),
            _rate(point.total_tokens_per_second),
        )

    row(report.single_stream, "one stream")
    row(report.kv_max_decode_only, "KV max, decode only")
    row(report.kv_max_sustained, "KV max, with prompts")
    waiting = f", {report.waiting_users:,} wait" if report.waiting_users else ""
    row(report.at_users, f"{report.inputs.users:,} users{waiting}")
    return _indent(table)


def _resources(report: CapacityReport) -> RenderableType:
    table = Table(box=None, header_style="dim", padding=(0, 2, 0, 0), pad_edge=False)
    table.add_column("", no_wrap=True)
    table.add_column("use", justify="right", no_wrap=True)
    table.add_column("of", justify="right", no_wrap=True)
    table.add_column("", justify="right", no_wrap=True)
    table.add_column("")
    marker = "← caps" if report.waiting_users else "← limits"
    for use in report.resources:
        if use.unit == "seconds per step":
            used, available = _seconds(use.used), f"{_seconds(use.available)} step"
        else:
            used, available = f"{use.used:,.0f} {use.unit}", f"{use.available:,.0f}"
        caps = use.resource == report.limited_by
        table.add_row(
            Text(LABEL[use.resource], style="bold" if caps else ""),
            used,
            available,
            Text(f"{use.ratio:.0%}", style="bold red" if caps else ""),
            Text(f"{marker} · {use.detail}" if caps else use.detail, style="bold" if caps else "dim"),
        )
    return _indent(table)


def _ttft(report: CapacityReport) -> RenderableType:
    t = report.ttft
    table = _grid()
    table.add_column(no_wrap=True)
    table.add_column()
    table.add_row(
        "alone",
        f"{_seconds(t.alone_seconds)} (one request, idle server)",
    )
    table.add_row(
        "all at once",
        f"p50 {_seconds(t.p50_seconds)} · p90 {_seconds(t.p90_seconds)} · last {_seconds(t.max_seconds)}",
    )
    table.add_row(
        "how",
        Text(
            f"{t.waves} wave{'s' if t.waves > 1 else ''} of up to {t.wave_sequences:,}; prompts prefill at "
            f"{_rate(t.prefill_tokens_per_second)} tokens/s; a wave takes {_seconds(t.wave_seconds)}",
            style="dim",
        ),
    )
    return _indent(table)


def _seed(report: CapacityReport) -> RenderableType:
    s = report.seed
    table = _grid()
    table.add_column(no_wrap=True, style="bold")
    table.add_column()
    table.add_row(
        "naive",
        f"one stream reads {_rate(s.single_stream_tokens_per_second)} tokens/s; ÷ {s.users:,} users = "
        f"{_rate(s.naive_per_user_tokens_per_second)} tokens/s each",
    )
    averaged = (
        f" ({_rate(s.batched_mean_per_user_tokens_per_second)} averaged over all {s.users:,}, waiting included)"
        if report.waiting_users
        else ""
    )
    table.add_row(
        "batched",
        f"{report.served_sequences:,} users share each step, which reads the weights once for all of them: "
        f"{_rate(s.batched_per_user_tokens_per_second)} tokens/s each while served{averaged}; "
        f"{_rate(s.batched_total_tokens_per_second)} tokens/s in total, {s.batching_gain:.0f} × one stream",
    )
    return _indent(table)


def _simulated(report: CapacityReport) -> RenderableType:
    sim = report.simulated
    assert sim is not None
    table = _grid()
    table.add_column(no_wrap=True)
    table.add_column(justify="right", no_wrap=True)
    table.add_column(style="dim")
    model = report.at_users
    capped = f" (of {report.inputs.users:,}: one process drives {sim.users:,})" if sim.users_capped else ""
    table.add_row(
        "run",
        _seconds(sim.wall_seconds),
        f"{sim.users:,} users{capped}, outputs {report.inputs.output_tokens} ± {sim.output_spread:.0%}; measured "
        f"after a {_seconds(sim.warmup_seconds)} warm-up; {sim.requests_completed:,} requests completed",
    )
    table.add_row(
        "mean batch",
        f"{sim.mean_batch_sequences:,.0f}",
        f"estimate {report.served_sequences:,}; max {sim.max_batch_sequences:,}, "
        f"{sim.mean_waiting:,.0f} waiting on average",
    )
    ratio = sim.total_tokens_per_second / sim.analytical_total_tokens_per_second
    table.add_row(
        "tok/s total",
        _rate(sim.total_tokens_per_second),
        f"estimate {_rate(sim.analytical_total_tokens_per_second)} ({ratio:.2f} ×)",
    )
    table.add_row(
        "tok/s each",
        _rate(sim.per_user_tokens_per_second),
        f"estimate {_rate(model.per_user_tokens_per_second)}; "
        f"{_rate(sim.mean_per_user_tokens_per_second)} averaged over all users",
    )
    if sim.ttft_p50_seconds is not None and sim.ttft_p90_seconds is not None:
        table.add_row(
            "TTFT",
            f"p50 {_seconds(sim.ttft_p50_seconds)} · p90 {_seconds(sim.ttft_p90_seconds)}",
            f"{sim.ttft_samples:,} requests, the arrival burst included; estimate for the burst: "
            f"p50 {_seconds(report.ttft.p50_seconds)} · p90 {_seconds(report.ttft.p90_seconds)}",
        )
    table.add_row("KV use", f"{sim.kv_usage_mean:.0%}", f"max {sim.kv_usage_max:.0%}; {sim.preemptions:,} preemptions")
    table.add_row("caps", LABEL[sim.limited_by] if sim.limited_by else "nothing", sim.limited_detail)
    if sim.lag_seconds > 0.05 * sim.wall_seconds:
        # the simulator's clock stands still while its host is late (llmdiag.sim.realtime): the rates above are per
        # simulated second, so they hold; the run just took longer
        table.add_row("host lag", _seconds(sim.lag_seconds), "host behind the physics: the simulated clock waited")
    return _indent(table)


def _notes(notes: list[str]) -> RenderableType:
    table = _grid()
    table.add_column(no_wrap=True)
    table.add_column()
    for note in notes:
        table.add_row("-", note)
    return _indent(Text.assemble() if not notes else table)


def render_capacity(report: CapacityReport) -> RenderableType:
    parts: list[RenderableType] = [
        _context(report),
        Panel(_headline(report), expand=False),
        Text("\nMemory per GPU", style="bold underline"),
        _memory(report),
        Text("\nDecode throughput", style="bold underline"),
        _throughput(report),
        Text(f"\nWhat runs out at {report.inputs.users:,} users", style="bold underline"),
        _resources(report),
        Text(f"\nTime to first token, {report.inputs.users:,} users arriving together", style="bold underline"),
        _ttft(report),
        Text("\nThe seed arithmetic", style="bold underline"),
        _seed(report),
    ]
    if report.simulated is not None:
        parts += [Text("\nSimulated (the built-in simulator, same case)", style="bold underline"), _simulated(report)]
    if report.notes:
        parts += [Text("\nNotes", style="bold underline"), _notes(report.notes)]
    return Group(*parts)


def render_capacity_json(report: CapacityReport) -> str:
    return report.model_dump_json(indent=2)
