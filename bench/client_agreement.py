"""Client-vs-server timing agreement, a section of bench/bench_client.py: our client against the simulator with
its per-request timings on, each request's client-side TTFT and gaps between events set against the server's.

Percentiles come from llmdiag.model.load.quantile (linear interpolation between closest ranks, as in the reports),
the definition the bench's own percentile function had: the figures are unchanged (to within float rounding).
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from client_runs import ClientRun, run_ours
from sim_process import SimProcess

from llmdiag.model.load import quantile


@dataclass
class Agreement:
    users: int = 0
    seconds: float = 0.0
    spread: float = 0.0
    run: ClientRun | None = None
    after_warmup: Agreement | None = None  # the same, for requests sent after the first ``warmup`` seconds
    warmup: float = 0.0
    requests_compared: int = 0  # successful on the client, with the server's timings under the same id
    requests_without_timings: int = 0
    event_count_mismatches: int = 0  # the client saw a different number of content events than the server wrote
    ttft_diff_ms: list[float] = field(default_factory=list)  # |client TTFT − server TTFT|
    itl_diff_ms: list[float] = field(default_factory=list)  # |client gap − server gap|, event by event
    # the same, only where the client read the two events in different reads (a gap of exactly 0: one read held
    # both, because the client fell more than a gap behind and the kernel merged the packets under one stamp)
    itl_diff_separate_reads_ms: list[float] = field(default_factory=list)
    delivery_ms: list[float] = field(default_factory=list)  # client arrival − server write, same clock
    send_to_handler_ms: list[float] = field(default_factory=list)  # server received_at − client started_at
    first_delivery_ms: list[float] = field(default_factory=list)  # client first token − server first write
    client_ttft_ms: list[float] = field(default_factory=list)
    server_ttft_ms: list[float] = field(default_factory=list)
    client_itl_ms: list[float] = field(default_factory=list)
    server_itl_ms: list[float] = field(default_factory=list)
    note: str = ""

    def summary(self) -> dict[str, Any]:
        def pct(values: list[float]) -> dict[str, float]:
            ordered = sorted(values)
            found = {"p50": quantile(ordered, 0.5), "p99": quantile(ordered, 0.99), "max": quantile(ordered, 1.0)}
            return {k: float("nan") if v is None else v for k, v in found.items()}  # NaN: nothing compared

        return {
            "users": self.users,
            "seconds": self.seconds,
            "output_spread": self.spread,
            "requests_compared": self.requests_compared,
            "requests_without_timings": self.requests_without_timings,
            "event_count_mismatches": self.event_count_mismatches,
            "gaps_compared": len(self.itl_diff_ms),
            "ttft_abs_diff_ms": pct(self.ttft_diff_ms),
            "itl_abs_diff_ms": pct(self.itl_diff_ms),
            "itl_abs_diff_separate_reads_ms": pct(self.itl_diff_separate_reads_ms),
            "gaps_in_one_read": len(self.itl_diff_ms) - len(self.itl_diff_separate_reads_ms),
            "delivery_ms": pct(self.delivery_ms),
            "send_to_handler_ms": pct(self.send_to_handler_ms),
            "first_delivery_ms": pct(self.first_delivery_ms),
            "client_ttft_ms": pct(self.client_ttft_ms),
            "server_ttft_ms": pct(self.server_ttft_ms),
            "client_itl_ms": pct(self.client_itl_ms),
            "server_itl_ms": pct(self.server_itl_ms),
            "note": self.note,
            "warmup_seconds": self.warmup,
            "after_warmup": self.after_warmup.summary() if self.after_warmup else None,
        }


def compare(agree: Agreement, records: list[dict[str, Any]], server: dict[str, dict[str, Any]]) -> None:
    """``records``: the client's requests (id, started, first_token, token_times: time.monotonic() seconds);
    ``server``: /sim/timings' ``requests``, id -> {received_at, event_times, event_tokens, ...}, the same clock."""
    for rec in records:
        if not rec["ok"] or rec["first_token"] is None:
            continue
        srv = server.get(rec["id"])
        if srv is None or not srv.get("event_times"):
            agree.requests_without_timings += 1
            continue
        agree.requests_compared += 1
        c_times, s_times = rec["token_times"], srv["event_times"]
        c_ttft = rec["first_token"] - rec["started"]
        s_ttft = s_times[0] - srv["received_at"]
        agree.client_ttft_ms.append(1e3 * c_ttft)
        agree.server_ttft_ms.append(1e3 * s_ttft)
        agree.ttft_diff_ms.append(1e3 * abs(c_ttft - s_ttft))
        agree.send_to_handler_ms.append(1e3 * (srv["received_at"] - rec["started"]))
        agree.first_delivery_ms.append(1e3 * (rec["first_token"] - s_times[0]))
        if len(c_times) != len(s_times):
            agree.event_count_mismatches += 1
        n = min(len(c_times), len(s_times))
        for i in range(n):
            agree.delivery_ms.append(1e3 * (c_times[i] - s_times[i]))
            if i:
                c_gap, s_gap = c_times[i] - c_times[i - 1], s_times[i] - s_times[i - 1]
                agree.client_itl_ms.append(1e3 * c_gap)
                agree.server_itl_ms.append(1e3 * s_gap)
                agree.itl_diff_ms.append(1e3 * abs(c_gap - s_gap))
                if c_gap > 0.0:
                    agree.itl_diff_separate_reads_ms.append(1e3 * abs(c_gap - s_gap))


def run_agreement(
    preset: str, users: int, seconds: float, prompt: int, output: int, scale: float, spread: float, warmup: float
) -> Agreement:
    """Our client with ``users`` users against the simulator with its timings on; every successful request compared,
    and separately those sent ``warmup`` seconds or more after the first (past the opening burst of ``users``
    simultaneous requests)."""
    agree = Agreement(users=users, seconds=seconds, spread=spread, warmup=warmup)
    keep = max(4096, int(users * seconds * 2))  # more than the requests the run can finish
    with SimProcess(preset, scale, record_timings=keep) as sim, tempfile.TemporaryDirectory() as tmp:
        records_path = Path(tmp) / "records.json"
        agree.run = run_ours(sim, users, seconds, prompt, output, records=records_path, output_spread=spread)
        if not records_path.exists():
            agree.note = agree.run.note or "the driver wrote no records"
            return agree
        timings = sim.get("/sim/timings", timeout=120)
        records = json.loads(records_path.read_text())
    if timings.get("dropped"):
        agree.note = f"the simulator dropped {timings['dropped']} requests' timings (capacity {timings['capacity']})"
    compare(agree, records, timings["requests"])
    if records:
        first = min(r["started"] for r in records)
        agree.after_warmup = Agreement(users=users, seconds=seconds, spread=spread)
        compare(agree.after_warmup, [r for r in records if r["started"] >= first + warmup], timings["requests"])
    return agree


def print_agreement(agreements: list[Agreement]) -> None:
    for a in agreements:
        r = a.run
        if r is None:
            continue
        print(
            f"\n== Client vs server timestamps: llmdiag, {a.users} concurrent streaming users, {a.seconds:g} s, "
            f"prompt {r.prompt_tokens} words, output {r.output_tokens} tokens ± {100 * a.spread:.0f} %, simulator "
            f"time scale {r.time_scale:g} =="
        )
        w = r.window
        print(
            f"completed {r.requests_ok} requests, errors {r.errors}, {r.tokens_client} tokens "
            f"({r.tokens_client / max(r.seconds, 1e-9):.0f}/s); steady window {w.tokens_per_s:.0f} tok/s, "
            f"client CPU {w.client_util:.2f} cores, simulator CPU {w.sim_util:.2f} cores, rest of the machine "
            f"{w.other_util:.2f} cores, simulator lag {w.lag:.2f} s"
        )
        if r.note or a.note:
            print(f"note: {' '.join(x for x in (r.note, a.note) if x)}")
        sm = a.summary()
        print(
            f"compared {sm['requests_compared']} requests ({sm['requests_without_timings']} without server timings, "
            f"{sm['event_count_mismatches']} with a different event count), {sm['gaps_compared']} token gaps"
        )
        late = a.after_warmup.summary() if a.after_warmup else None
        print(f"{'':34} {'every request':^26} | {'sent ≥ ' + format(a.warmup, 'g') + ' s in':^17}")
        print(f"{'':34} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} | {'p50 ms':>8} {'p99 ms':>8}")
        for key, label in (
            ("ttft_abs_diff_ms", "|client TTFT − server TTFT|"),
            ("send_to_handler_ms", "  of which: sent → server reads it"),
            ("first_delivery_ms", "  of which: 1st event write → read"),
            ("itl_abs_diff_ms", "|client gap − server gap| (ITL)"),
            ("itl_abs_diff_separate_reads_ms", "  events read apart (gap > 0)"),
            ("delivery_ms", "every event: write → client read"),
            ("client_ttft_ms", "client TTFT"),
            ("server_ttft_ms", "server TTFT"),
            ("client_itl_ms", "client ITL"),
            ("server_itl_ms", "server ITL"),
        ):
            v = sm[key]
            tail = f" | {late[key]['p50']:>8.2f} {late[key]['p99']:>8.2f}" if late else ""
            print(f"{label:34} {v['p50']:>8.2f} {v['p99']:>8.2f} {v['max']:>8.2f}{tail}")
        if late:
            print(f"{'requests compared':34} {sm['requests_compared']:>26} | {late['requests_compared']:>17}")
        print(
            f"{'gaps whose two events came in one read':40} {sm['gaps_in_one_read']:>20} "
            f"({100 * sm['gaps_in_one_read'] / max(1, sm['gaps_compared']):.2f} % of {sm['gaps_compared']})"
        )
        for name, summary in (("every request", sm), (f"sent ≥ {a.warmup:g} s in", late)):
            if summary is None or not summary["requests_compared"]:
                continue
            ttft, itl = summary["ttft_abs_diff_ms"]["p99"], summary["itl_abs_diff_ms"]["p99"]
            print(
                f"target p99 ≤ 5 ms, {name}: TTFT {'met' if ttft <= 5 else 'NOT met'} ({ttft:.3f} ms), "
                f"ITL {'met' if itl <= 5 else 'NOT met'} ({itl:.3f} ms)"
            )
    if agreements:
        print(
            "sent → server reads it: from the client writing the request to the simulator's stamp of its arrival; "
            "1st event write → read and every event: from the simulator writing an event to the client's stamp "
            "of its arrival (one clock, time.monotonic()). Both sides stamp arrivals with the kernel's receive "
            "time of the read (SO_TIMESTAMPNS, llmdiag/client/rxtime.py), so neither event loop's lag under a "
            "thousand streams counts. Events that pile up unread while the client is more than a gap behind reach "
            "it in one read under the stamp of the last one (the kernel merges them): their gap reads 0, counted "
            "above."
        )
