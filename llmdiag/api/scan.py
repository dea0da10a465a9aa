"""One server: a live scan, the built-in demo, saved dumps and logs -> a Verdict."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from llmdiag.api.record import ScanCall, active_recorder, model_from_json
from llmdiag.api.trace import analyze_traces as analyze_traces
from llmdiag.client.endpoint import Connection, redact_url
from llmdiag.collect import DEFAULT_DURATION_SECONDS
from llmdiag.collect.bundle import Bundle, read_bundle
from llmdiag.collect.canary import LABEL as CANARY_LABEL
from llmdiag.collect.live import ProgressCallback, TelemetryOptions, collect_live
from llmdiag.collect.source import unavailable_source
from llmdiag.collect.tape import REPLAY_HINT, Tape, taped_value, using
from llmdiag.collect.trace.signals import merge_trace_signals
from llmdiag.config import Settings
from llmdiag.engine.baseline import Baseline, add_baseline_signals
from llmdiag.engine.capacity import deployment_seen, roofline_for_window, roofline_signal
from llmdiag.engine.derived import add_derived
from llmdiag.engine.evaluate import build_verdict
from llmdiag.engine.settle import VerdictSettler
from llmdiag.errors import InputFileError, LlmdiagError, UsageError, option
from llmdiag.model import Roofline, SignalSet, SourceInfo, TraceReport, Verdict
from llmdiag.physics.hardware import ModelSpec, cached_model_config, load_model_config
from llmdiag.physics.step import Deployment


def diagnose(
    connection: Connection,
    duration_seconds: float = DEFAULT_DURATION_SECONDS,
    settings: Settings | None = None,
    on_progress: ProgressCallback | None = None,
    telemetry: TelemetryOptions | None = None,
    deployment: Deployment | None = None,
    canary: bool = False,
    canary_off_reason: str = "",
    baseline: Baseline | None = None,
    trace: TraceReport | None = None,
    server: str | None = None,
    auto_duration: bool = False,
) -> Verdict:
    """Scan a live server and its telemetry (NVML, a DCGM exporter page, the host) over a window and judge it.

    ``server`` names the server's probe (vllm, sglang, tgi, llamacpp …); None works it out from what the server
    answers (``llmdiag.collect.detect``), and the coverage says which was picked and why.

    With the ``deployment`` (GPU, model, TP) known, the verdict also places the measured decode rate under the
    physics ceiling, which tells a compute verdict whether math or HBM bandwidth is the wall. With a ``baseline``
    (medians of the target's past checks, from `llmdiag check`'s history), the regression rules compare against it.

    With ``auto_duration``, ``duration_seconds`` is the longest window: it ends as soon as the verdict holds still
    (``llmdiag.engine.settle``), and the notes say when and why.

    Inside ``llmdiag.api.record.recording_to(recorder)``, everything the scan reads is recorded as one run of the
    recorder's bundle.
    """
    call = ScanCall(
        connection,
        duration_seconds,
        settings,
        telemetry,
        deployment,
        canary,
        canary_off_reason,
        baseline,
        trace,
        server,
        auto_duration,
    )
    recorder = active_recorder()
    if recorder is None:
        return _diagnose(call, on_progress)
    with recorder.tape(redact_url(connection.base_url), call) as taping:
        taping.verdict = _diagnose(call, on_progress)
    return taping.verdict


def _diagnose(call: ScanCall, on_progress: ProgressCallback | None) -> Verdict:
    from llmdiag.collect.detect import check_server_name, note_server_choice

    connection, duration_seconds, settings, server = call.connection, call.duration_seconds, call.settings, call.server
    canary, auto_duration = call.canary, call.auto_duration

    probe = check_server_name(server) if server is not None else None  # None: detected by collect_live
    settler = VerdictSettler() if auto_duration else None
    signals = collect_live(
        connection,
        duration_seconds,
        probe=probe,
        on_progress=on_progress,
        telemetry=call.telemetry,
        canary=canary,
        settled=(lambda so_far, elapsed: settler.observe(build_verdict(so_far, settings), elapsed))
        if settler
        else None,
    )
    if probe is not None:
        note_server_choice(signals, probe, f"{option('server')} {probe} given")
    if not canary and call.canary_off_reason:
        note = f"{CANARY_LABEL}: not sent ({call.canary_off_reason})"
        signals.sources.append(unavailable_source("canary", CANARY_LABEL, note))
    if call.baseline is not None:
        add_baseline_signals(signals, call.baseline)
    if call.trace is not None:
        merge_trace_signals(signals, call.trace)
    roofline = place_under_ceiling(signals, call.deployment)
    verdict = build_verdict(signals, settings, target=redact_url(connection.base_url))
    verdict.roofline = roofline
    if settler is not None:
        verdict.notes.append(settler.describe(duration_seconds))
    return verdict


def cached_model(name: str) -> tuple[ModelSpec, str] | None:
    """A served model the model table lacks, from the Hugging Face cache on this machine (its config.json); what
    a recorded scan found there is replayed from its bundle."""
    return taped_value(
        f"value huggingface-cache {name}",
        lambda: _cached_model(name),
        lambda found: None if found is None else {"model": dataclasses.asdict(found[0]), "where": found[1]},
        lambda value: None if value is None else (model_from_json(value["model"]), str(value["where"])),
    )


def _cached_model(name: str) -> tuple[ModelSpec, str] | None:
    path = cached_model_config(name)
    if path is None:
        return None
    try:
        return load_model_config(path), f"the Hugging Face cache's {path}"
    except InputFileError:
        return None  # a shape llmdiag does not model (MLA, no hidden size): no ceiling rather than a wrong one


def place_under_ceiling(signals: SignalSet, deployment: Deployment | None) -> Roofline | None:
    """The decode rate under the deployment's ceiling, as a signal the rules read (CMP008's proof): the deployment
    given, else the one the window shows (one GPU of a known kind serving a known model; the coverage says where
    each fact came from)."""
    where = f"given ({option('gpu')}/{option('model_shape')}/{option('tp')})"
    if deployment is None:
        deployment, where = deployment_seen(signals, local_model=cached_model)
        if deployment is None:
            return None
        signals.sources.append(SourceInfo(probe="deployment", server="deployment", note=where))
    add_derived(signals)  # the roofline reads the window's batch; the rules may then cite the roofline
    roofline = roofline_for_window(deployment, signals)
    if roofline is not None:
        signals.add(roofline_signal(roofline, where))
    return roofline


DEMO_WARMUP_SECONDS = 3.0


def run_demo(
    preset_name: str,
    duration_seconds: float = DEFAULT_DURATION_SECONDS,
    settings: Settings | None = None,
    on_progress: ProgressCallback | None = None,
    on_phase: Callable[[str], None] | None = None,
    auto_duration: bool = False,
) -> Verdict:
    """Start the simulator in a preset state, drive its bounded load, and scan it like any server.

    The scan is the same code path as ``diagnose``: the simulator speaks vLLM on the wire, and its DCGM page is
    read as a dcgm-exporter's would be with ``--dcgm-url``.
    """
    from llmdiag.sim.load import ClosedLoopLoad
    from llmdiag.sim.presets import get_preset
    from llmdiag.sim.server import SimServer

    preset = get_preset(preset_name)
    say = on_phase or (lambda _: None)
    with SimServer(preset) as server:
        say(f"simulated vLLM at {server.url}: {preset.summary}")
        max_seconds = DEMO_WARMUP_SECONDS + duration_seconds + 30
        with ClosedLoopLoad(server.url, server.model, preset.load, max_seconds=max_seconds):
            say(f"driving {preset.load.users} users for {DEMO_WARMUP_SECONDS:.0f} s before the scan")
            time.sleep(DEMO_WARMUP_SECONDS)
            verdict = diagnose(
                Connection(base_url=server.url),
                duration_seconds,
                settings,
                on_progress,
                # the simulator's GPUs are on its DCGM page; this machine's GPUs and CPU are not the server's
                telemetry=TelemetryOptions(dcgm_url=server.dcgm_url, nvml="off", host=False),
                canary=True,
                deployment=preset.deployment,
                auto_duration=auto_duration,
            )
    verdict.target = f"llmdiag demo --preset {preset.name} ({verdict.target})"
    return verdict


def diagnose_files(
    paths: list[Path],
    settings: Settings | None = None,
    max_bytes: int | None = None,
    server: str | None = None,
    since: str | None = None,
    until: str | None = None,
) -> Verdict:
    """Judge the saved files of one incident, any mix: server logs, /metrics dumps (one: lifetime averages or a
    snapshot; two or more: a window between them), TensorRT-LLM's JSON, dcgm-exporter pages. Each file is told
    apart by what it holds (``llmdiag.collect.evidence``); pasted text around the data is fine.

    ``server`` names the server's probe for the logs and the dumps; None works it out. ``since``/``until`` (ISO
    times, or spans like ``30m`` before the last line) cut the logs' window; the dumps are taken whole."""
    from llmdiag.collect.evidence import ReadOptions, collect_evidence, describe_files, sort_files

    options = ReadOptions(server=server, since=since, until=until, max_bytes=max_bytes or None)
    if not paths:
        raise UsageError("no files given", "llmdiag analyze FILE [FILE …] (logs, /metrics dumps, DCGM pages)")
    evidence = sort_files(paths)
    signals = collect_evidence(paths, options, evidence)
    roofline = place_under_ceiling(signals, None)
    verdict = build_verdict(signals, settings, target=describe_files(paths, evidence))
    verdict.roofline = roofline
    return verdict


def diagnose_logs(
    paths: list[Path],
    settings: Settings | None = None,
    since: str | None = None,
    until: str | None = None,
    max_bytes: int | None = None,
) -> Verdict:
    """Judge server logs (vLLM stat-logger lines, SGLang batch lines, TensorRT-LLM iteration JSON): the same entry
    point as ``diagnose_files``, kept under its old name."""
    return diagnose_files(paths, settings, max_bytes=max_bytes, since=since, until=until)


# --- replay -------------------------------------------------------------------------------------------------------


@dataclass
class ReplayedRun:
    name: str
    verdict: Verdict | None
    recorded: str | None  # the live verdict's JSON, as the bundle holds it
    error: LlmdiagError | None = None  # the run's failure, replayed (a bundle of several runs goes on past it)


def replay_bundle(path: Path, settings: Settings | None = None) -> tuple[Bundle, list[ReplayedRun]]:
    """Every run of the bundle at ``path`` replayed through the live collect path. ``settings``: judge with these
    instead of the recorded ones. A run that failed live fails again here, with its error: raised for a bundle of
    one run, kept in its ``ReplayedRun`` for a bundle of several (check's targets, load's levels)."""
    bundle = read_bundle(path)
    replayed = []
    for run in bundle.runs:
        try:
            verdict = _replay_run(path, run.name, run.call, run.tape, settings)
        except LlmdiagError as error:
            if len(bundle.runs) == 1:
                raise
            replayed.append(ReplayedRun(run.name, None, run.verdict, error))
            continue
        replayed.append(ReplayedRun(run.name, verdict, run.verdict))
    return bundle, replayed


def _replay_run(path: Path, name: str, recorded: dict, tape: dict, settings: Settings | None) -> Verdict:
    if recorded.get("kind") == "telemetry":  # a source alone (bench/gpu_check.py --record): no server, no window loop
        return _replay_telemetry(str(recorded.get("source", "nvml")), Tape.from_json(tape), settings, name)
    try:
        call = ScanCall.from_json(recorded)
    except (KeyError, TypeError, ValueError, LlmdiagError) as exc:
        message = exc.message if isinstance(exc, LlmdiagError) else f"{type(exc).__name__}: {exc}"
        raise InputFileError(
            f"{path}: run {name!r} has a call this llmdiag cannot read ({message})", REPLAY_HINT
        ) from None
    if settings is not None:
        call.settings = settings
    with using(Tape.from_json(tape)):
        verdict = replay_call(call)
    if isinstance(recorded.get("target"), str):
        verdict.target = recorded["target"]
    return verdict


def _replay_telemetry(source_name: str, tape: Tape, settings: Settings | None, name: str) -> Verdict:
    """A telemetry source's recorded reads judged as analyze judges GPU telemetry alone: the server's signals
    unavailable, with the reason."""
    from llmdiag.collect.evidence import no_server
    from llmdiag.collect.signals import build_signal_set
    from llmdiag.collect.taped import replay_source_reads

    source, scrapes = replay_source_reads(source_name, tape)
    signals = build_signal_set(source.spec, scrapes, source.display_url)
    signals.sources[-1].config.update(source.details)
    no_server(signals, [f"{source.label or source_name} recording ({name})"])
    return build_verdict(signals, settings, target=source.display_url)


def replay_call(call: ScanCall) -> Verdict:
    if call.kind == "collect":
        from llmdiag.collect.live import collect_live
        from llmdiag.engine.evaluate import build_verdict

        signals = collect_live(call.connection, call.duration_seconds, telemetry=call.telemetry)
        return build_verdict(signals, call.settings, target=redact_url(call.connection.base_url))
    return diagnose(
        call.connection,
        call.duration_seconds,
        call.settings,
        telemetry=call.telemetry,
        deployment=call.deployment,
        canary=call.canary,
        canary_off_reason=call.canary_off_reason,
        baseline=call.baseline,
        trace=call.trace,
        server=call.server,
        auto_duration=call.auto_duration,
    )
