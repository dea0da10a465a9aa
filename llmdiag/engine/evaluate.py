"""Stage 2: judge a SignalSet with the rules and build the Verdict.

A rule is skipped when an input it needs is unavailable, passes when its gate does not hold or its
ladder signal is below the warning threshold, and fires otherwise. The bottleneck class comes from the cause graph
(llmdiag.engine.causes): a stall first, else the most severe class that no other firing class explains. With no
finding the window is idle (a count of finished requests, tokens or latency observations stayed at zero),
healthy, or unknown when the core signals needed to call it healthy are missing or nothing shows it idle.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from llmdiag.config import Settings
from llmdiag.engine.causes import Choice, choose
from llmdiag.engine.confidence import class_confidence, from_logs, judge, terms
from llmdiag.engine.derived import add_derived
from llmdiag.engine.fixes import engine_fixes, engine_of, fixes_for
from llmdiag.engine.slo import add_slo_signals
from llmdiag.engine.whatif import fix_effects
from llmdiag.engine.whatif_inputs import whatif_inputs
from llmdiag.errors import option
from llmdiag.model import (
    BOTTLENECK_CATEGORIES,
    Bottleneck,
    Category,
    ClassCoverage,
    Coverage,
    Evidence,
    Experience,
    Finding,
    RuleOutcome,
    Severity,
    SignalSet,
    Verdict,
)
from llmdiag.schema.loader import load_rules
from llmdiag.schema.rules import PLACEHOLDER_RE, Condition, Ladder, RuleSpec, SignalRef

# signals without which "healthy" cannot be claimed
CORE_SIGNALS = ("requests_running", "requests_waiting", "kv_cache_usage_ratio", "ttft_seconds", "itl_seconds")
# server logs print no latency histogram: judged from the stat lines (ITL estimated from them), TTFT is left out
LOG_CORE_SIGNALS = ("requests_running", "requests_waiting", "kv_cache_usage_ratio", "itl_seconds")
# a server without the latency histogram (TGI and llama.cpp have no TTFT; llama.cpp may lack ITL): the scan's own
# canary requests measured the same thing from the client side, and stand in for the healthy/idle judgement only
CLIENT_STAND_INS = {"ttft_seconds": "client_ttft_seconds", "itl_seconds": "client_tpot_seconds"}
# what shows requests were served in the window (signal, stat, the canaries' share of it, what it counts): idle needs
# one of them to have stayed at zero beyond the canaries; gauges at 0 miss whatever came and went between readings
WORK_EVIDENCE = (
    ("requests_finished_per_second", "increase", "client_requests_sent", "requests finished"),
    ("generation_tokens_per_second", "increase", "client_output_tokens", "output tokens generated"),
    ("prompt_tokens_per_second", "increase", "client_prompt_tokens", "prompt tokens processed"),
    ("ttft_seconds", "count", "client_requests_sent", "first tokens timed"),
    ("itl_seconds", "count", "client_output_tokens", "inter-token times observed"),
    ("e2e_latency_seconds", "count", "client_requests_sent", "request latencies observed"),
)
# below this mean queue no queueing rule fires (their warning threshold): a server that never preempts shows a full
# KV cache only as waiting requests, so with none its missing KV gauge does not stop a healthy verdict
QUEUE_FREE_BELOW = 1.0
# why a class could not be judged when the probe its rules need was absent from the scan; with the probe present,
# the skipped rules' own reasons are given instead (e.g. a profiling field switched off in dcgm-exporter)
# (built when used: they name options, llmdiag.errors.option)
NOT_EVALUATED_REASON: dict[Category, Callable[[], str]] = {
    Category.network: lambda: (
        "vLLM's metrics do not show inter-GPU communication; it needs GPU telemetry (NVML on the GPU host, or "
        f"{option('dcgm_url')} for dcgm-exporter's page) or profiler traces, which this scan did not have"
    ),
}
TELEMETRY_PROBES = {Category.network: frozenset({"dcgm", "nvml"})}
# the user's TPOT SLO breached (advisory: what users feel, not what limits the server). With no class found and no
# proof either way (CMP008: the step is the wall; SCH013/SCH014: the host is), slow tokens are not healthy: unknown
SLO_BREACH = "CMP001"


def _lookup(signals: SignalSet, ref: SignalRef) -> tuple[float | None, str]:
    """The value, or None and why not."""
    signal = signals.get(ref.signal)
    if signal is None:
        return None, f"{ref.signal} is not collected by any probe in this scan"
    if signal.unavailable is not None:
        return None, f"{ref.signal} unavailable: {signal.unavailable}"
    value = signal.stats.get(ref.stat)
    if value is None:
        return None, f"{ref.signal} has no '{ref.stat}'"
    return value, ""


def _evidence(signals: SignalSet, ref: SignalRef, threshold: float | None = None, op: str = "") -> Evidence:
    signal = signals.get(ref.signal)
    value, _ = _lookup(signals, ref)
    return Evidence(
        signal=ref.signal,
        stat=ref.stat,
        value=value,
        unit=signal.unit if signal else "",
        threshold=threshold,
        op=op,
        source=signal.source if signal else "",
        window_seconds=signal.window_seconds if signal else None,
        verify=signal.verify if signal else "",
    )


def _severity(ladder: Ladder, value: float, warning: float, critical: float | None) -> Severity | None:
    if ladder.direction == "above":
        if critical is not None and value >= critical:
            return Severity.critical
        return Severity.warning if value >= warning else None
    if critical is not None and value <= critical:
        return Severity.critical
    return Severity.warning if value <= warning else None


def render_summary(template: str, signals: SignalSet) -> str:
    def fill(match: re.Match[str]) -> str:
        value, _ = _lookup(signals, SignalRef(signal=match.group(1), stat=match.group(2)))
        if value is None:
            return "unavailable"
        return format(value, match.group(3) or ".3g")

    return PLACEHOLDER_RE.sub(fill, template)


def _core_signals(signals: SignalSet) -> tuple[str, ...]:
    return LOG_CORE_SIGNALS if from_logs(signals) else CORE_SIGNALS


def evaluate_rule(
    rule: RuleSpec, signals: SignalSet, settings: Settings, server: str = "vllm"
) -> tuple[RuleOutcome, Finding | None]:
    muted = settings.mute_reason(rule.code)
    if muted:
        return RuleOutcome(code=rule.code, status="muted", reason=muted), None
    measured: list[float | None] = []
    for ref in (rule.severity, *rule.gate):
        found, why = _lookup(signals, ref)
        if found is None and not (isinstance(ref, Condition) and ref.if_missing == "pass"):
            return RuleOutcome(code=rule.code, status="skipped", reason=why), None
        measured.append(found)
    value, gate_values = measured[0], measured[1:]
    assert value is not None
    for cond, observed in zip(rule.gate, gate_values, strict=True):
        if observed is not None and not cond.holds(observed):
            reason = f"gate not met: {cond.signal}.{cond.stat} = {observed:.4g}, needs {cond.op} {cond.value:g}"
            return RuleOutcome(code=rule.code, status="passed", reason=reason), None
    override = settings.rules.get(rule.code)
    warning = override.warning if override and override.warning is not None else rule.severity.warning
    critical = override.critical if override and override.critical is not None else rule.severity.critical
    severity = _severity(rule.severity, value, warning, critical)
    if severity is None:
        ladder = f"{rule.severity.signal}.{rule.severity.stat}"
        reason = f"{ladder} = {value:.4g}, short of the warning threshold {warning:g}"
        return RuleOutcome(code=rule.code, status="passed", reason=reason), None
    ladder_op = ">=" if rule.severity.direction == "above" else "<="
    threshold = critical if severity is Severity.critical and critical is not None else warning
    evidence = [_evidence(signals, rule.severity, threshold, ladder_op)]
    evidence += [_evidence(signals, c, c.value, c.op) for c in rule.gate]
    evidence += [_evidence(signals, ref) for ref in rule.evidence]
    # how far past the threshold, as a ratio: orders findings of equal severity
    if rule.severity.direction == "above":
        margin = value / threshold if threshold > 0 else 1.0 + value
    else:
        margin = threshold / value if value > 0 else 1e6
    finding = Finding(
        code=rule.code,
        slug=rule.slug,
        title=rule.title,
        category=rule.category,
        severity=severity,
        summary=render_summary(rule.summary, signals),
        evidence=evidence,
        why=rule.why,
        fixes=fixes_for(rule, engine_of(server)),
        engine_fixes=engine_fixes(rule),
        margin=min(margin, 1e6),
        advisory=rule.advisory,
        stall=rule.stall,
    )
    return RuleOutcome(code=rule.code, status="fired", reason=finding.summary), finding


def _coverage(rules: tuple[RuleSpec, ...], outcomes: list[RuleOutcome], signals: SignalSet) -> Coverage:
    by_code = {o.code: o for o in outcomes}
    classes = []
    for category in BOTTLENECK_CATEGORIES:
        mine = [by_code[r.code] for r in rules if r.category is category]
        ran = [o for o in mine if o.status in ("fired", "passed")]
        skipped = [o for o in mine if o.status == "skipped"]
        reason = ""
        if not ran:
            probes = {s.probe for s in signals.sources if s.ok}
            no_telemetry = category in NOT_EVALUATED_REASON and not probes & TELEMETRY_PROBES.get(category, probes)
            reason = (
                NOT_EVALUATED_REASON[category]()
                if no_telemetry
                else (f"all {len(mine)} rules skipped: {skipped[0].reason}" if skipped else "no rules for this class")
            )
        classes.append(
            ClassCoverage(
                category=category, evaluated=bool(ran), rules_run=len(ran), rules_skipped=len(skipped), reason=reason
            )
        )
    return Coverage(probes=list(signals.sources), classes=classes, rules=outcomes)


def _experience(signals: SignalSet) -> Experience:
    def val(name: str, stat: str) -> float | None:
        return _lookup(signals, SignalRef(signal=name, stat=stat))[0]

    return Experience(
        ttft_p50_seconds=val("ttft_seconds", "p50"),
        ttft_p90_seconds=val("ttft_seconds", "p90"),
        itl_p50_seconds=val("itl_seconds", "p50"),
        itl_p90_seconds=val("itl_seconds", "p90"),
        ttft_p95_seconds=val("ttft_seconds", "p95"),
        tpot_p95_seconds=val("tpot_seconds", "p95"),
        per_user_tokens_per_second=val("per_user_tokens_per_second", "value"),
        per_user_tokens_per_second_incl_waiting=val("per_user_tokens_per_second_incl_waiting", "value"),
        requests_running_mean=val("requests_running_avg", "value"),
        requests_waiting_mean=val("requests_waiting_avg", "value"),
        generation_tokens_per_second=val("generation_tokens_per_second", "rate"),
        client_requests=int(count) if (count := val("client_ttft_seconds", "count")) is not None else None,
        client_ttft_p50_seconds=val("client_ttft_seconds", "p50"),
        client_ttft_p90_seconds=val("client_ttft_seconds", "p90"),
        client_tpot_p50_seconds=val("client_tpot_seconds", "p50"),
    )


def _canaries(signals: SignalSet) -> dict[str, float]:
    """What the scan's own canary requests sent and received (0 without canaries)."""
    names = ("client_requests_sent", "client_output_tokens", "client_prompt_tokens")
    return {n: _lookup(signals, SignalRef(signal=n, stat="value"))[0] or 0.0 for n in names}


def _work_counts(signals: SignalSet) -> tuple[list[str], list[str], list[str]]:
    """What the counters and histogram counts say was served beyond the canaries: (counts that moved, printed
    averages that moved, what stayed at zero). A count is read even where its signal is unavailable as a rate or a
    quantile (one dump: no rate; no observation: no quantile): the count itself is what it is. A log's stat line
    printed only a per-second average over the interval before it: moved or not, with no count to report."""
    canaries = _canaries(signals)
    counted: list[str] = []
    printed: list[str] = []
    still: list[str] = []
    for name, stat, canary, what in WORK_EVIDENCE:
        signal = signals.get(name)
        value = signal.stats.get(stat) if signal is not None else None
        if signal is not None and value is None and stat == "increase" and signal.unavailable is None:
            rate = signal.stats.get("rate")
            if rate is not None:
                (printed if rate > 0 else still).append(f"{what} at {rate:.3g}/s")
            continue
        if value is None:
            continue
        (counted if value > canaries[canary] else still).append(f"{value:.0f} {what}")
    return counted, printed, still


def _idleness(signals: SignalSet) -> tuple[bool | None, str]:
    """Whether nothing but the scan's own canary requests ran, waited, finished or produced a token in the window,
    with what says so. True needs positive evidence: a counter or histogram count that stayed at zero, since a gauge
    is one reading each and misses whatever came and went between readings. False: something ran or was served
    (the text says what, where the gauges missed it). None: it cannot be told (the text says why). The canaries go
    one at a time, so they can show as one running request and as at most the tokens they sent and received."""
    running, _ = _lookup(signals, SignalRef(signal="requests_running", stat="max"))
    waiting, _ = _lookup(signals, SignalRef(signal="requests_waiting", stat="max"))
    if running is None or waiting is None:
        return None, ""
    if running > (1 if _canaries(signals)["client_requests_sent"] else 0) or waiting > 0:
        return False, ""
    counted, printed, still = _work_counts(signals)
    moved = counted + printed
    if signals.window.kind == "snapshot" and counted and not printed:
        # one page counts since the server started: whether before this moment or just now, it cannot say
        return None, (
            f"nothing ran or waited at the one moment judged, but {' and '.join(counted)} since the server "
            "started: one moment cannot tell an idle server from one between requests"
        )
    if moved:
        return False, (
            f"the running and waiting gauges read 0 in every reading, yet the counts show {' and '.join(moved)}: the "
            "requests came and went between readings (or the gauges missed them); judged from the counts"
        )
    if still:
        return True, ""
    return None, (
        "nothing ran or waited at any reading, but no finished-request count, token count or latency histogram is "
        "available to show that nothing was served between the readings"
    )


def confidence(bottleneck: Bottleneck, choice: Choice, signals: SignalSet) -> tuple[float, list[str]]:
    """How far the verdict can be trusted (the fitted model: llmdiag.engine.confidence), and what lowered it."""
    judged = judge(bottleneck, choice, signals, _core_signals(signals))
    return judged.score, judged.notes


def _summary(
    bottleneck: Bottleneck,
    primary: Finding | None,
    signals: SignalSet,
    missing: list[str],
    idle_why: str = "",
    breach: Finding | None = None,
) -> str:
    text = _class_summary(bottleneck, primary, signals, missing, idle_why, breach)
    if signals.window.kind == "snapshot":
        text += " (judged from one snapshot: gauges at one moment, no rates)"
    return text


def _class_summary(
    bottleneck: Bottleneck,
    primary: Finding | None,
    signals: SignalSet,
    missing: list[str],
    idle_why: str,
    breach: Finding | None,
) -> str:
    if primary is not None and bottleneck is Bottleneck.stalled:
        return f"Stalled: {primary.summary}"
    if primary is not None:
        return f"{bottleneck.value.capitalize()}-bound: {primary.summary}"
    if bottleneck is Bottleneck.idle:
        duration = signals.window.duration_seconds or 0.0
        canaries = _lookup(signals, SignalRef(signal="client_requests_sent", stat="value"))[0]
        besides = f" besides this scan's {canaries:.0f} canary requests" if canaries else ""
        return (
            f"Idle: no request ran, waited or produced a token in the {duration:.0f} s window{besides}; "
            "nothing to diagnose."
        )
    if bottleneck is Bottleneck.healthy and from_logs(signals):
        return render_summary(
            "Healthy: {generation_tokens_per_second.rate:.0f} output tokens/s across "
            "{requests_running_avg.value:.1f} running requests ({per_user_tokens_per_second.value:.0f} tokens/s "
            "each), {requests_waiting_avg.value:.1f} waiting on average, KV cache at most "
            "{kv_cache_usage_ratio.max:.0%}; inter-token latency ≈ {itl_seconds.mean:.3f} s (estimated from the "
            "log; logs carry no TTFT).",
            signals,
        )
    if bottleneck is Bottleneck.healthy:
        ttft = "TTFT p50 {ttft_seconds.p50:.3f} s"
        if not _has(signals, "ttft_seconds", "p50"):
            ttft = "TTFT p50 {client_ttft_seconds.p50:.3f} s (llmdiag's canary requests)"
        itl = "inter-token latency p50 {itl_seconds.p50:.3f} s"
        if not _has(signals, "itl_seconds", "p50"):
            itl = (
                "inter-token latency mean {itl_seconds.mean:.3f} s"
                if _has(signals, "itl_seconds", "mean")
                else "time per output token p50 {client_tpot_seconds.p50:.3f} s (llmdiag's canary requests)"
            )
        rate = (
            "{generation_tokens_per_second.rate:.0f} output tokens/s across {requests_running_avg.value:.1f} "
            "running requests ({per_user_tokens_per_second.value:.0f} tokens/s each)"
        )
        if not _has(signals, "generation_tokens_per_second", "rate"):  # TGI counts requests, not tokens
            rate = (
                "{requests_finished_per_second.rate:.1f} requests/s finished, {requests_running_avg.value:.1f} "
                "running on average"
            )
        return render_summary(
            f"Healthy: {rate}, {{requests_waiting_avg.value:.1f}} waiting on average; {ttft}, {itl}.", signals
        )
    waiting = _lookup(signals, SignalRef(signal="requests_waiting_avg", stat="value"))[0]
    reasons = []
    for name in missing:
        signal = signals.get(name)
        reasons.append(f"{name} ({signal.unavailable})" if signal is not None and signal.unavailable else name)
    if breach is not None:
        return _unproven_slow_tokens(signals) + (" Missing too: " + "; ".join(reasons) + "." if reasons else "")
    if waiting is not None and waiting >= QUEUE_FREE_BELOW:
        slots = ""
        if _has(signals, "batch_slots_in_use_ratio", "value"):
            slots = render_summary(
                " with {requests_running.max:.0f} of {max_active_requests.last:.0f} slots busy at peak", signals
            )
        return (
            f"Unknown: {waiting:.1f} requests waiting on average{slots}, and no rule could say what holds them "
            "back; missing " + "; ".join(reasons) + "."
        )
    if idle_why and bottleneck is Bottleneck.unknown:  # nothing ran at any reading: idle, but not shown to be
        return f"Unknown: {idle_why}" + ("; missing " + "; ".join(reasons) if reasons else "") + "."
    return "Unknown: too little evidence to judge; missing " + "; ".join(reasons) + "."


def _unproven_slow_tokens(signals: SignalSet) -> str:
    """Tokens slower than the SLO with no class found: what users wait, why neither the step nor the host is shown
    to be the wall, and what would show it."""
    said = render_summary(
        "Unknown: tokens come {itl_seconds.mean:.3f} s apart on average, {itl_mean_over_slo_tpot_ratio.value:.1f}x "
        "the TPOT SLO of {slo_tpot_seconds.value:.3f} s, with {requests_running_avg.value:.1f} running and "
        "nothing preempted, but nothing shows what sets that pace",
        signals,
    )
    proofs = signals.get("step_wall_proofs_count")
    if proofs is None or proofs.unavailable is not None:
        reason = proofs.unavailable if proofs is not None else "no proof computed"
        why = f"Whether the decode step is the wall could not be judged ({reason})"
    else:  # judged, and neither proof held: the step is not shown to be the wall, and no host rule fired either
        judged = [
            render_summary(text, signals)
            for name, text in (
                ("roofline_fraction_ratio", "decode at {roofline_fraction_ratio.value:.0%} of the ceiling"),
                (
                    "itl_seconds_per_running_request",
                    "the step {itl_seconds_per_running_request.value:+.4f} s per running request (R² "
                    "{itl_seconds_per_running_request_r2.value:.2f})",
                ),
            )
            if _has(signals, name, "value")
        ]
        why = (
            f"The decode step is not shown to be the wall ({', '.join(judged)}), nor the host (no GPU seen "
            "waiting, no server process seen pinned)"
        )
    return (
        f"{said}. {why}. To tell: GPU telemetry (NVML on the GPU host, or {option('dcgm_url')}) shows whether the "
        f"GPUs wait, and the deployment ({option('gpu')} with {option('model_shape')}, or one known GPU serving a "
        "known model) places the decode rate under its ceiling; a window in which the batch varies (a load that "
        "rises or falls) fits the step time against the batch."
    )


def _has(signals: SignalSet, name: str, stat: str) -> bool:
    return _lookup(signals, SignalRef(signal=name, stat=stat))[0] is not None


def _missing_core(signals: SignalSet) -> tuple[list[str], list[str]]:
    """The core signals a healthy verdict lacks, and the notes for what stood in for the others.

    A missing TTFT (or ITL) histogram is covered by the canary requests' client-side figures; a missing KV gauge on
    a server that never preempts (by design) is covered by an empty queue, the only way KV pressure shows there.
    """
    missing, notes = [], []
    for name in _core_signals(signals):
        signal = signals.get(name)
        if signal is not None and signal.unavailable is None:
            continue
        client = CLIENT_STAND_INS.get(name, "")
        if client and _has(signals, client, "p50"):
            count = _lookup(signals, SignalRef(signal=client, stat="count"))[0] or 0
            what = "TTFT" if name == "ttft_seconds" else "time per output token"
            why = (
                "the server exposes none"
                if signal is None
                or "not exposed" in (signal.unavailable or "")
                or ("no latency" in (signal.unavailable or ""))
                else f"the server's is unavailable: {signal.unavailable}"
            )
            notes.append(f"{what} from llmdiag's own canary requests ({count:.0f}, client side): {why}")
            continue
        waiting = _lookup(signals, SignalRef(signal="requests_waiting_avg", stat="value"))[0]
        preempt = signals.get("preemptions_per_second")
        never_preempts = preempt is not None and preempt.unavailable is None and "by design" in preempt.source
        if name == "kv_cache_usage_ratio" and never_preempts and waiting is not None and waiting < QUEUE_FREE_BELOW:
            reason = signal.unavailable if signal is not None else "not collected"
            notes.append(
                f"KV cache usage unavailable ({reason}); judged from the queue instead: this server never "
                f"preempts, so a full KV cache would keep requests waiting, and {waiting:.2f} waited on "
                "average"
            )
            continue
        missing.append(name)
    return missing, notes


def _stand_ins(rules: tuple[RuleSpec, ...], outcomes: list[RuleOutcome], findings: list[Finding]) -> None:
    """A rule with ``instead_of`` judges only where that rule could not (its inputs unavailable, e.g. in logs)."""
    status = {o.code: o.status for o in outcomes}
    for rule in rules:
        if rule.instead_of is None or status.get(rule.instead_of) == "skipped":
            continue
        index = next(i for i, o in enumerate(outcomes) if o.code == rule.code)
        if outcomes[index].status == "muted":
            continue
        reason = f"{rule.instead_of} judged this window (its inputs are available); {rule.code} stands in only without"
        outcomes[index] = RuleOutcome(code=rule.code, status="skipped", reason=reason)
        findings[:] = [f for f in findings if f.code != rule.code]


def build_verdict(signals: SignalSet, settings: Settings | None = None, target: str = "") -> Verdict:
    settings = settings or Settings()
    add_slo_signals(signals, settings)
    add_derived(signals)
    rules = tuple(r for r in load_rules() if r.scope == "server")  # fleet rules: llmdiag.engine.fleet
    server = signals.sources[0].probe.removesuffix("-log") if signals.sources else "vllm"
    outcomes: list[RuleOutcome] = []
    findings: list[Finding] = []
    for rule in rules:
        outcome, finding = evaluate_rule(rule, signals, settings, server)
        outcomes.append(outcome)
        if finding is not None:
            findings.append(finding)
    _stand_ins(rules, outcomes, findings)
    # a stall first (nothing else explains a stuck engine), then the cause graph: see llmdiag.engine.causes
    choice = choose(findings)
    findings, primary = choice.findings, choice.primary
    missing, stand_in_notes = _missing_core(signals)
    idle: bool | None = None
    idle_why = ""
    breach: Finding | None = None  # slow tokens that no class explains
    if primary is not None and primary.stall:
        bottleneck = Bottleneck.stalled
    elif primary is not None:
        bottleneck = Bottleneck(primary.category.value)
    else:
        idle, idle_why = _idleness(signals)
        if idle is False:  # traffic was served: healthy only if its tokens came within the SLO
            breach = next((f for f in findings if f.code == SLO_BREACH), None)
        if idle:
            bottleneck = Bottleneck.idle
        elif idle is False and not missing and breach is None:
            bottleneck = Bottleneck.healthy
        else:
            bottleneck = Bottleneck.unknown
    judged = judge(bottleneck, choice, signals, _core_signals(signals))
    score, notes = judged.score, judged.notes
    if bottleneck in (Bottleneck.healthy, Bottleneck.idle):
        notes = stand_in_notes + notes
    if primary is None and idle is False and idle_why:
        notes = [idle_why, *notes]
    label = "high" if score >= 0.75 else "medium" if score >= 0.5 else "low"
    inputs = whatif_inputs(signals)
    by_code = {rule.code: rule for rule in rules}
    for finding in findings:
        spec = by_code.get(finding.code)
        if spec is not None and finding.fixes:
            entries = [(dict(w.set), w.not_modelled) for w in spec.fix.whatif]
            finding.predicted = fix_effects(entries, inputs, bottleneck.value)
    return Verdict(
        target=target,
        bottleneck=bottleneck,
        confidence=round(score, 2),
        confidence_label=label,
        summary=_summary(bottleneck, primary, signals, missing, idle_why if idle is None else "", breach),
        window=signals.window,
        findings=findings,
        coverage=_coverage(rules, outcomes, signals),
        experience=_experience(signals),
        signals=signals.signals,
        notes=notes + signals.anomalies,
        class_confidence=class_confidence(bottleneck, round(score, 2), findings, judged.factors),
        confidence_factors=terms(judged.factors),
        whatif_inputs=inputs,
    )
