"""The command line's options: the option types the commands share, the option dataclasses that group related
options, and ``flag_groups``, which lets a typer command take those dataclasses as parameters.

A command with many options takes a few groups instead (``scan``: how to reach the server, its telemetry, how its
pages are read, the deployment, the output, the fleet, Prometheus), so no function has more than a dozen parameters
and two commands that share options share their definition and what is built from them (a ``Connection``, the
telemetry to read, a ``PrometheusSource``). Typer reads a command's options from its signature; ``flag_groups``
writes that signature from the groups' fields, in their order, so ``--help`` lists the options as they are
declared, and packs the parsed values back into the groups before the command runs.

``flag_name`` is how the CLI spells a library parameter in messages (``llmdiag.errors.option``): the CLI installs
it at startup.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import os
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer

from llmdiag.client.endpoint import DEFAULT_MAX_METRICS_BYTES, Connection, parse_header
from llmdiag.config import Settings, load_settings
from llmdiag.errors import UsageError

if TYPE_CHECKING:
    from llmdiag.collect.live import TelemetryOptions
    from llmdiag.collect.prometheus.api import PrometheusSource

# ---------------------------------------------------------------------------------------------------------------
# The flags' names in messages from below the CLI (llmdiag.errors.option): keys are the library's parameter names

FLAG_NAMES = {
    "ca_file": "--prometheus-ca",
    "deadline_seconds": "--deadline",
    "duration_seconds": "--duration",
    "end_unix": "--to",
    "for_duration": "--for",
    "headers": "--header",
    "max_bytes": "--max-metrics-bytes",  # analyze's dumps and logs (diagnose_files, diagnose_logs)
    "max_requests": "--requests",
    "password_env": "--prometheus-password-env",
    "pids": "--pid",
    "slo_ttft_seconds": "--slo-ttft",
    "slo_tpot_seconds": "--slo-tpot",
    "start_unix": "--from",
    "step_seconds": "--step",
    "target_names": "--target",
    "target_timeout_seconds": "--target-timeout",
    "targets_file": "--targets",
    "timeout_seconds": "--timeout",
    "token_env": "--prometheus-token-env",
    "token_file": "--prometheus-token-file",
    "user": "--prometheus-user",
}


def flag_name(key: str) -> str:
    """The flag of a library parameter: FLAG_NAMES's, else ``--`` and the name with '-' for '_'."""
    return FLAG_NAMES.get(key, "--" + key.replace("_", "-"))


# ---------------------------------------------------------------------------------------------------------------
# Option dataclasses as typer parameters

Command = TypeVar("Command", bound=Callable[..., Any])
KEYWORD = inspect.Parameter.KEYWORD_ONLY


def flag_groups(command: Command) -> Command:
    """Let a typer command take option dataclasses (and dataclasses nested in them) as parameters.

    Typer cannot take a dataclass as options, so the command typer sees has one keyword parameter per field, in
    place of the dataclass and in the order of its fields (a subclass that redefines a field keeps its place); a
    field's annotation is its ``Annotated[type, typer.Option(...)]`` and its default the option's default. The
    parsed values are packed back into the dataclasses before ``command`` runs. Apply it below ``app.command()``.
    """
    hints = typing.get_type_hints(command, include_extras=True)
    parameters: list[inspect.Parameter] = []
    packers: dict[str, Callable[[dict[str, Any]], Any]] = {}
    for parameter in inspect.signature(command).parameters.values():
        hint = hints.get(parameter.name, parameter.annotation)
        if isinstance(hint, type) and dataclasses.is_dataclass(hint):
            packers[parameter.name] = _expand(hint, parameters)
        else:
            parameters.append(parameter.replace(annotation=hint, kind=KEYWORD))
            packers[parameter.name] = _take(parameter.name)
    names = [p.name for p in parameters]
    clashes = sorted({n for n in names if names.count(n) > 1})
    if clashes:
        raise TypeError(f"{command.__qualname__}: option names given twice: {', '.join(clashes)}")

    @functools.wraps(command)
    def parsed(**values: Any) -> Any:
        return command(**{name: pack(values) for name, pack in packers.items()})

    parsed.__signature__ = inspect.Signature(parameters)  # type: ignore[attr-defined]  # typeshed's functions lack it
    parsed.__annotations__ = {p.name: p.annotation for p in parameters}
    return typing.cast(Command, parsed)


def _take(name: str) -> Callable[[dict[str, Any]], Any]:
    return lambda values: values[name]


def _expand(group: type, parameters: list[inspect.Parameter]) -> Callable[[dict[str, Any]], Any]:
    """Append the group's fields to ``parameters``; return what builds the group from the parsed values."""
    hints = typing.get_type_hints(group, include_extras=True)
    packers: dict[str, Callable[[dict[str, Any]], Any]] = {}
    for field in dataclasses.fields(group):
        hint = hints[field.name]
        if isinstance(hint, type) and dataclasses.is_dataclass(hint):
            packers[field.name] = _expand(hint, parameters)
            continue
        default: Any = inspect.Parameter.empty
        if field.default is not dataclasses.MISSING:
            default = field.default
        elif field.default_factory is not dataclasses.MISSING:
            default = field.default_factory()
        parameters.append(inspect.Parameter(field.name, KEYWORD, default=default, annotation=hint))
        packers[field.name] = _take(field.name)
    return lambda values: group(**{name: pack(values) for name, pack in packers.items()})


def refuse(given: Mapping[str, object], why: str, hint: str) -> None:
    """A usage error naming the options (keys) that were given (values set) and cannot go with this run."""
    names = [name for name, value in given.items() if value]
    if names:
        raise UsageError(f"{', '.join(names)} {why}", hint)


def check_outputs(as_json: bool, markdown: bool) -> None:
    """--json and --markdown both replace what is printed: one of them at a time."""
    if as_json and markdown:
        raise UsageError("--json and --markdown both print to stdout", "pick one (--html PATH writes a file)")


def check_writable(path: Path | None, flag: str) -> None:
    """Refuse a file that cannot be written before the run that would fill it (a load takes minutes)."""
    if path is None:
        return
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise UsageError(f"cannot write {path}: no folder {folder}", f"pick another {flag} path")
    if path.is_dir():
        raise UsageError(f"cannot write {path}: it is a folder", f"pick another {flag} path")
    if folder_is_read_only(folder):
        raise UsageError(f"cannot write {path}: {folder} is on a read-only file system", f"pick another {flag} path")
    if not os.access(folder, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise UsageError(f"cannot write {path}: permission denied", f"pick another {flag} path")
    if folder_is_full(folder):
        raise UsageError(
            f"cannot write {path}: no space left on the disk that holds {folder}",
            f"free some space, or pick another {flag} path on another disk",
        )


def folder_is_read_only(folder: Path) -> bool:
    try:
        return bool(os.statvfs(folder).f_flag & os.ST_RDONLY)
    except OSError:
        return False  # not known: the write itself will say


def folder_is_full(folder: Path) -> bool:
    """No free block at all (root may use the reserved ones: it counts them). A disk that fills up during the run
    is still caught when the file is written."""
    try:
        stat = os.statvfs(folder)
    except OSError:
        return False
    return (stat.f_bfree if os.geteuid() == 0 else stat.f_bavail) == 0


# ---------------------------------------------------------------------------------------------------------------
# Option types the commands share


class FailOn(str, Enum):
    warning = "warning"
    critical = "critical"
    never = "never"


JsonOpt = Annotated[bool, typer.Option("--json", help="Print the verdict as JSON (schema_version inside).")]
FailOnOpt = Annotated[FailOn, typer.Option("--fail-on", help="Exit 1 when a finding is at or above this severity.")]
ConfigOpt = Annotated[
    Path | None, typer.Option("--config", help="Settings file (default: ./llmdiag.toml when present).")
]
SloTpotOpt = Annotated[
    float | None,
    typer.Option(
        "--slo-tpot",
        help="The time-per-output-token SLO, in seconds, that slow decode is judged against (default: "
        "slo_tpot_seconds in llmdiag.toml, else 0.05).",
        min=0.001,
        max=60.0,
    ),
]


def with_slo(settings: Settings, slo_tpot: float | None) -> Settings:
    """The settings with the command line's TPOT SLO, which wins over llmdiag.toml's."""
    return settings if slo_tpot is None else settings.model_copy(update={"slo_tpot_seconds": slo_tpot})


HtmlOpt = Annotated[
    Path | None,
    typer.Option("--html", help="Also write a self-contained HTML report (charts inline, no network) to this file."),
]
MarkdownOpt = Annotated[
    bool, typer.Option("--markdown", help="Print a compact Markdown summary (for an issue or a chat) instead.")
]
# how to reach a server and its telemetry: the same flags for `scan`, `check` and `load`
MetricsUrlOpt = Annotated[
    str | None, typer.Option("--metrics-url", help="Where /metrics lives, if not at URL/metrics.")
]
HeaderOpt = Annotated[
    list[str] | None, typer.Option("--header", "-H", help="Extra HTTP header 'Name: value' (repeatable).")
]
ApiKeyOpt = Annotated[
    str | None,
    typer.Option("--api-key", help="Bearer token (or set LLMDIAG_API_KEY). Never printed.", show_default=False),
]
InsecureOpt = Annotated[bool, typer.Option("--insecure", help="Accept self-signed TLS certificates.")]
DcgmUrlOpt = Annotated[
    str | None,
    typer.Option(
        "--dcgm-url",
        help="dcgm-exporter's page for the server's GPUs (e.g. http://HOST:9400/metrics): GPU telemetry "
        "for the compute and network rules. Sent no credentials.",
    ),
]
NvmlOpt = Annotated[
    bool, typer.Option("--nvml/--no-nvml", help="Read this machine's GPUs through NVML when a driver is present.")
]
PidOpt = Annotated[
    list[int] | None,
    typer.Option(
        "--pid",
        help="The server's process (repeatable; children included). Default: the process "
        "listening on URL's port, when the server runs on this machine.",
    ),
]
SelectorOpt = Annotated[
    str | None,
    typer.Option(
        "--selector",
        help="With --prometheus: a label matcher list, e.g. '{job=\"vllm\"}'.",
        rich_help_panel="Prometheus",
    ),
]


# ---------------------------------------------------------------------------------------------------------------
# Option groups: what scan has, and check, analyze and demo share


RecordOpt = Annotated[
    Path | None,
    typer.Option(
        "--record",
        help="Also save everything the probes saw (pages, detection, canary timings, GPU and host samples, options) "
        "as a bundle .tar.gz to attach to a bug report; `llmdiag analyze FILE` replays it. Secrets are left out.",
    ),
]


def flags_json(**groups: object) -> dict[str, Any]:
    """The options of a run as a bundle's manifest lists them: header names only, no API key, no URL password."""
    from llmdiag.errors import redact_url

    def plain(key: str, value: Any) -> Any:
        if key == "header" and value:
            return [parse_header(h)[0] + ": <redacted>" for h in value]
        if key == "api_key":
            return "<redacted>" if value else None
        if isinstance(value, Enum):
            return value.value
        if isinstance(value, Path):
            return str(value)
        if isinstance(value, str) and "://" in value:
            return redact_url(value)
        if isinstance(value, list | tuple):
            return [plain("", v) for v in value]
        return value if isinstance(value, str | int | float | bool | type(None)) else str(value)

    out: dict[str, Any] = {}
    for name, group in groups.items():
        if dataclasses.is_dataclass(group) and not isinstance(group, type):
            out[name] = {f.name: plain(f.name, getattr(group, f.name)) for f in dataclasses.fields(group)}
        else:
            out[name] = plain(name, group)
    return out


@dataclass(frozen=True, kw_only=True)
class ConnectionFlags:
    """How to reach a server (scan, check)."""

    metrics_url: MetricsUrlOpt = None
    header: HeaderOpt = None
    api_key: ApiKeyOpt = None
    timeout: Annotated[
        float, typer.Option("--timeout", help="Seconds each HTTP request may take in all (head and body).")
    ] = 5.0
    insecure: InsecureOpt = False

    def connection(self, url: str, max_metrics_bytes: int = DEFAULT_MAX_METRICS_BYTES) -> Connection:
        """How to reach the server at ``url`` (load builds these flags from its own)."""
        if self.timeout <= 0:
            raise UsageError(f"--timeout must be positive, got {self.timeout:g}")
        if self.insecure:  # asked for: urllib3's warning on every scrape would only bury the report
            import warnings

            from urllib3.exceptions import InsecureRequestWarning

            warnings.filterwarnings("ignore", category=InsecureRequestWarning)
        return Connection(
            base_url=url,
            metrics_url=self.metrics_url,
            headers=dict(parse_header(h) for h in self.header or []),
            api_key=self.api_key,
            timeout_seconds=self.timeout,
            insecure=self.insecure,
            max_metrics_bytes=max_metrics_bytes,
        )


@dataclass(frozen=True, kw_only=True)
class TelemetryFlags:
    """What is read beside the server's own page: GPU telemetry, and the canary requests (check)."""

    dcgm_url: DcgmUrlOpt = None
    nvml: NvmlOpt = True
    probe: Annotated[
        bool | None,
        typer.Option(
            "--probe/--no-probe",
            help="Send a few small streaming canary requests through the server's "
            "API during the window (default: yes, unless --metrics-url says only metrics are reachable).",
        ),
    ] = None


def telemetry_options(
    dcgm_url: str | None, nvml: bool, pid: list[int] | None, nvml_replay: Path | None = None
) -> TelemetryOptions:
    """The telemetry a live scan reads, from the flags (scan and load)."""
    from llmdiag.collect.live import TelemetryOptions  # the HTTP stack: not for the commands that read files

    return TelemetryOptions(
        dcgm_url=dcgm_url,
        nvml="auto" if nvml or nvml_replay else "off",
        nvml_library=load_nvml_replay(nvml_replay) if nvml_replay else None,
        pids=pid or [],
    )


def load_nvml_replay(path: Path) -> object:
    from llmdiag.collect.bundle import is_bundle, read_bundle
    from llmdiag.collect.telemetry.nvml_record import ReplayNvml  # a test's stand-in for the driver: rarely used

    try:
        if is_bundle(path):  # bench/gpu_check.py --record: NVML's answers ride in the first run's tape
            entries = read_bundle(path).runs[0].tape.get("channels", {}).get("nvml-library") or [{}]
            return ReplayNvml.from_recording(entries[0].get("value"))
        return ReplayNvml.from_file(path)
    except (OSError, ValueError) as exc:
        hint = "give a recording written by bench/gpu_check.py --record"
        raise UsageError(f"--nvml-replay {path}: {exc}", hint) from None


@dataclass(frozen=True, kw_only=True)
class ScanTelemetryFlags(TelemetryFlags):
    """scan's telemetry: check's, and the server's processes, or an NVML recording played back."""

    nvml_replay: Annotated[
        Path | None,
        typer.Option(
            "--nvml-replay",
            hidden=True,
            help="Play back an NVML recording (bench/gpu_check.py --record) instead of the local driver.",
        ),
    ] = None
    pid: PidOpt = None

    def telemetry(self) -> TelemetryOptions:
        return telemetry_options(self.dcgm_url, self.nvml, self.pid, self.nvml_replay)


@dataclass(frozen=True, kw_only=True)
class PagesFlags:
    """How the server's pages are read: which server's (scan, analyze)."""

    max_metrics_bytes: Annotated[
        int, typer.Option("--max-metrics-bytes", help="Refuse metrics pages larger than this.", min=1024)
    ] = DEFAULT_MAX_METRICS_BYTES
    server: Annotated[
        str | None,
        typer.Option(
            "--server",
            help="The server: vllm, sglang, tgi, llamacpp, trtllm, triton. Default: worked out from "
            "its metric names, headers and endpoints (the verdict says which and why).",
        ),
    ] = None


@dataclass(frozen=True, kw_only=True)
class OutputFlags:
    """What a verdict becomes: printed as what, judged against which settings, failing at what (analyze)."""

    as_json: JsonOpt = False
    fail_on: FailOnOpt = FailOn.critical
    config: ConfigOpt = None
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Also print every signal.")] = False
    html: HtmlOpt = None
    markdown: MarkdownOpt = False
    slo_tpot: SloTpotOpt = None

    def check(self) -> None:
        check_outputs(self.as_json, self.markdown)
        check_writable(self.html, "--html")  # before the window, not after it

    def settings(self) -> Settings:
        return with_slo(load_settings(self.config), self.slo_tpot)


@dataclass(frozen=True, kw_only=True)
class DemoOutputFlags(OutputFlags):
    """The demo's output: it is bottlenecked on purpose, so it fails on nothing unless told."""

    fail_on: FailOnOpt = FailOn.never
    record: RecordOpt = None


@dataclass(frozen=True, kw_only=True)
class ScanOutputFlags(OutputFlags):
    """scan's output: its --fail-on default depends on what is scanned (a server, or the demo), so None until scan
    knows; each of scan's modes puts in its default before the value is used."""

    fail_on: Annotated[
        FailOn | None,
        typer.Option(
            "--fail-on",
            help="Exit 1 when a finding is at or above this severity (default critical; "
            "never for the demo, which is bottlenecked on purpose).",
        ),
    ] = None  # type: ignore[assignment]  # None until scan's mode puts in its default; OutputFlags' is a FailOn
    record: RecordOpt = None


@dataclass(frozen=True, kw_only=True)
class FleetFlags:
    """Several servers scanned at once (scan)."""

    targets_file: Annotated[
        Path | None,
        typer.Option(
            "--targets",
            help="A file of targets to scan as a fleet: one URL a line (NAME=URL allowed, "
            "'#' comments), or a .toml with [[targets]] as for check.",
        ),
    ] = None
    concurrency: Annotated[
        int, typer.Option("--concurrency", help="Fleet scans: targets scanned at once.", min=1, max=256)
    ] = 8
    target_timeout: Annotated[
        float | None,
        typer.Option(
            "--target-timeout",
            help="Fleet scans: give up on a target after this many seconds (default: --duration + 30).",
            min=1.0,
        ),
    ] = None


@dataclass(frozen=True, kw_only=True)
class PrometheusAuthFlags:
    """How to reach Prometheus (scan, check): its credentials and CA."""

    token_env: Annotated[
        str | None,
        typer.Option(
            "--prometheus-token-env",
            help="Bearer token for Prometheus from this environment variable.",
            rich_help_panel="Prometheus",
        ),
    ] = None
    token_file: Annotated[
        Path | None,
        typer.Option(
            "--prometheus-token-file", help="Bearer token for Prometheus from this file.", rich_help_panel="Prometheus"
        ),
    ] = None
    user: Annotated[
        str | None,
        typer.Option(
            "--prometheus-user",
            help="Basic-auth user for Prometheus (with --prometheus-password-env).",
            rich_help_panel="Prometheus",
        ),
    ] = None
    password_env: Annotated[
        str | None,
        typer.Option(
            "--prometheus-password-env",
            help="Basic-auth password from this environment variable.",
            rich_help_panel="Prometheus",
        ),
    ] = None
    ca: Annotated[
        Path | None,
        typer.Option(
            "--prometheus-ca", help="CA bundle (PEM) for Prometheus's TLS certificate.", rich_help_panel="Prometheus"
        ),
    ] = None

    def source(self, url: str, connection: ConnectionFlags) -> PrometheusSource:
        """The Prometheus at ``url``, with --header and --insecure from the connection flags (and at least 30 s
        for a query)."""
        from llmdiag.collect.prometheus.api import PrometheusSource  # the HTTP stack: only with --prometheus

        return PrometheusSource.from_options(
            url,
            connection.header,
            self.token_env,
            self.token_file,
            self.user,
            self.password_env,
            self.ca,
            connection.insecure,
            timeout_seconds=max(connection.timeout, 30.0),
        )


@dataclass(frozen=True, kw_only=True)
class PrometheusWindowFlags:
    """Which time Prometheus is read over (scan): a window ending at a time, a span, or a timeline."""

    at: Annotated[
        str | None,
        typer.Option(
            "--at",
            help="With --prometheus: judge the window ending at this time (unix seconds, ISO time, "
            "or a span ago like 30m); the window is 60 s or 4 scrape intervals.",
            rich_help_panel="Prometheus",
        ),
    ] = None
    since: Annotated[
        str | None,
        typer.Option(
            "--since",
            help="With --prometheus: judge the span before now (e.g. 1h) as one window.",
            rich_help_panel="Prometheus",
        ),
    ] = None
    time_from: Annotated[
        str | None,
        typer.Option(
            "--from",
            help="With --prometheus and --to: judge [--from, --to] as one window (a timeline with --step).",
            rich_help_panel="Prometheus",
        ),
    ] = None
    time_to: Annotated[
        str | None, typer.Option("--to", help="End of the --from range.", rich_help_panel="Prometheus")
    ] = None
    step: Annotated[
        str | None,
        typer.Option(
            "--step",
            help="With --prometheus and --from/--to (or --since): a verdict timeline, one per "
            "step (e.g. 1m); 'auto' for ~30 steps.",
            rich_help_panel="Prometheus",
        ),
    ] = None


@dataclass(frozen=True, kw_only=True)
class ScanPrometheusFlags:
    """scan --prometheus: the servers read from Prometheus instead of scraped (a fleet, or a fleet timeline)."""

    url: Annotated[
        str | None,
        typer.Option(
            "--prometheus",
            help="Read the servers from this Prometheus (or Mimir/Thanos) query API instead "
            "of scraping them: every instance the --selector holds, each judged on its own.",
            rich_help_panel="Prometheus",
        ),
    ] = None
    selector: SelectorOpt = None
    window: PrometheusWindowFlags = dataclasses.field(default_factory=PrometheusWindowFlags)
    auth: PrometheusAuthFlags = dataclasses.field(default_factory=PrometheusAuthFlags)


@dataclass(frozen=True, kw_only=True)
class CheckPrometheusFlags:
    """check --prometheus: every server Prometheus holds, over its last minute."""

    url: Annotated[
        str | None,
        typer.Option(
            "--prometheus",
            help="Check every server this Prometheus (or Mimir/Thanos) holds under "
            "--selector, over its last minute (or --duration), plus the fleet rules across them: one "
            "target per instance.",
            rich_help_panel="Prometheus",
        ),
    ] = None
    selector: SelectorOpt = None
    auth: PrometheusAuthFlags = dataclasses.field(default_factory=PrometheusAuthFlags)
