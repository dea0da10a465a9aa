"""A Prometheus (or Mimir, Thanos) server as the source: the same SignalSets as a direct scan, one per instance, from
PromQL generated out of the probe specs (``probes/*.toml``), never hand-written per rule.

What is asked, for all instances at once (so the number of queries does not grow with the fleet):

    which instances, which server   /api/v1/series for the specs' wire names under the selector, over the window
    counters                        increase(NAME{SEL}[W])                     (rate = increase / W)
    histograms                      histogram_quantile(q, sum by (instance labels, le) (rate(NAME_bucket{SEL}[W])))
                                    for q = 0.5, 0.9, 0.95, 0.99, with the bucket and _sum increases, in one query
    gauges                          a range query of last_over_time(NAME{SEL}[S]) every S over the window (S = the
                                    scrape interval, or avg_over_time over a longer S when the window is long): the
                                    samples for the charts, and last/mean/min/max from them
    info                            last_over_time(NAME{SEL}[W])
    GPU (dcgm-exporter)             the dcgm probe's signals, joined to each server by pod, else by host

Counters and gauges keep every label, so the specs' ``match``, ``fold_labels``, ``per_gpu`` and per-engine
breakdowns work exactly as they do on a scraped page (``llmdiag.collect.signals.SignalBuilder`` builds the signals
from the query results). ``W`` is the requested span (``--at`` with the default window, ``--since``, ``--from/--to``)
and at least 4 scrape intervals; the scrape interval is discovered from /api/v1/targets (or from sample spacing).

A timeline (``collect_prometheus_timeline``) runs the same queries as range queries with ``W`` = the step: the query
count depends neither on the fleet size nor on the number of steps.

Every signal's ``source`` is ``prometheus: <the PromQL>`` and its ``verify`` a curl of that query (credentials as
shell variables, never their values). A query that fails leaves its signals unavailable with the server's words;
an instance with no data has every signal unavailable, so its verdict is ``unknown``, never healthy.
"""

from __future__ import annotations

import math
import os
import re
import shlex
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import requests

from llmdiag.client.endpoint import normalise_base_url, parse_header, redact_url
from llmdiag.collect.prometheus import LabelKey, Scrape, label_key
from llmdiag.collect.signals import SignalBuilder
from llmdiag.errors import ConnectError, ProbeTimeout, PrometheusQueryError, UsageError
from llmdiag.model import Signal, SignalSet, SourceInfo, Window
from llmdiag.schema.loader import load_probe
from llmdiag.schema.probes import ProbeSpec, SignalSpec

SERVER_PROBES = ("vllm", "sglang", "tgi", "llamacpp", "trtllm", "triton")
# the labels that tell one scrape target (one server process) from another
INSTANCE_LABELS = ("job", "instance", "namespace", "pod")
QUANTILES = ((0.5, "p50"), (0.9, "p90"), (0.95, "p95"), (0.99, "p99"))
TAG = "llmdiag_part"  # a label the histogram query adds to tell its parts apart
MIN_WINDOW_INTERVALS = 4  # a rate needs samples: W is at least this many scrape intervals
DEFAULT_WINDOW_SECONDS = 60.0
MAX_GAUGE_POINTS = 120  # per series, per gauge query: longer windows average over longer steps
DEFAULT_TIMELINE_STEPS = 30
FALLBACK_INTERVAL_SECONDS = 15.0  # Prometheus's default scrape_interval, when nothing better is known


# --------------------------------------------------------------------------------------------------------------------
# the HTTP side


@dataclass
class PrometheusSource:
    """Where and how to reach a Prometheus-compatible query API. Secrets live here and are never printed.

    ``token_from`` / ``password_from`` say where the secret came from ("env NAME", "file PATH"), for the curl lines.
    """

    url: str
    headers: dict[str, str] = field(default_factory=dict)
    token: str | None = None
    token_from: str = ""
    username: str | None = None
    password: str | None = None
    password_from: str = ""
    ca_file: str | None = None
    insecure: bool = False
    timeout_seconds: float = 30.0
    queries: int = 0  # HTTP requests to the API so far
    warnings: list[str] = field(default_factory=list)  # what Prometheus warned about (partial data …)

    def __post_init__(self) -> None:
        self.url = normalise_base_url(self.url)
        self.display_url = redact_url(self.url)
        self._session: requests.Session | None = None

    # -- building one from CLI-style options --------------------------------------------------------------------
    @classmethod
    def from_options(
        cls,
        url: str,
        headers: list[str] | None = None,
        token_env: str | None = None,
        token_file: Path | None = None,
        user: str | None = None,
        password_env: str | None = None,
        ca_file: Path | None = None,
        insecure: bool = False,
        timeout_seconds: float = 30.0,
    ) -> PrometheusSource:
        token, token_from = None, ""
        if token_env and token_file:
            raise UsageError("give the Prometheus token once: --prometheus-token-env or --prometheus-token-file")
        if token_env:
            token = os.environ.get(token_env)
            if not token:
                raise UsageError(
                    f"--prometheus-token-env {token_env}: that variable is not set or empty",
                    f"export {token_env}=... before running llmdiag",
                )
            token_from = f"env {token_env}"
        elif token_file:
            try:
                token = token_file.read_text(encoding="utf-8").strip()
            except OSError as exc:
                raise UsageError(f"--prometheus-token-file {token_file}: {exc.strerror or exc}") from None
            if not token:
                raise UsageError(f"--prometheus-token-file {token_file} is empty")
            token_from = f"file {token_file}"
        password, password_from = None, ""
        if password_env and not user:
            raise UsageError("--prometheus-password-env needs --prometheus-user")
        if user:
            if not password_env:
                raise UsageError("--prometheus-user needs --prometheus-password-env NAME (the password's variable)")
            password = os.environ.get(password_env)
            if password is None:
                raise UsageError(f"--prometheus-password-env {password_env}: that variable is not set")
            password_from = f"env {password_env}"
        if token and user:
            raise UsageError("give either a bearer token or basic auth for Prometheus, not both")
        if ca_file is not None and not ca_file.is_file():
            raise UsageError(f"--prometheus-ca {ca_file}: no such file", "give the CA bundle as a PEM file")
        parsed = dict(parse_header(h) for h in headers or [])
        return cls(
            url=url,
            headers=parsed,
            token=token,
            token_from=token_from,
            username=user,
            password=password,
            password_from=password_from,
            ca_file=str(ca_file) if ca_file else None,
            insecure=insecure,
            timeout_seconds=timeout_seconds,
        )

    # -- requests ---------------------------------------------------------------------------------------------
    def _client(self) -> requests.Session:
        if self._session is None:
            session = requests.Session()
            session.headers.update({"User-Agent": "llmdiag", "Accept": "application/json"})
            session.headers.update(self.headers)
            if self.token:
                session.headers["Authorization"] = f"Bearer {self.token}"
            if self.username:
                session.auth = (self.username, self.password or "")
            session.verify = False if self.insecure else (self.ca_file or True)
            self._session = session
        return self._session

    def close(self) -> None:
        if self._session is not None:
            self._session.close()
            self._session = None

    def _secret_texts(self) -> list[str]:
        return [s for s in (self.token, self.password) if s]

    def _scrub(self, text: str) -> str:
        for secret in self._secret_texts():
            text = text.replace(secret, "***")
        return text

    def api(self, path: str, params: dict[str, str], what: str) -> Any:
        """POST (form) to ``/api/v1/<path>``; the ``data`` of a success, or a PrometheusQueryError in plain words."""
        url = f"{self.url}/api/v1/{path}"
        self.queries += 1
        try:
            resp = self._client().post(url, data=params, timeout=self.timeout_seconds)
        except requests.exceptions.SSLError:
            raise ConnectError(
                f"TLS handshake with {self.display_url} failed",
                "give the CA with --prometheus-ca FILE, or pass --insecure",
            ) from None
        except requests.exceptions.Timeout:
            raise ProbeTimeout(
                f"{self.display_url} did not answer {what} within {self.timeout_seconds:g} s",
                "narrow --selector or the time range",
            ) from None
        except requests.exceptions.ConnectionError:
            raise ConnectError(
                f"cannot connect to Prometheus at {self.display_url}",
                "is the URL right? e.g. --prometheus http://prometheus:9090",
            ) from None
        except requests.exceptions.RequestException as exc:
            raise ConnectError(f"request to {self.display_url} failed: {type(exc).__name__}") from None
        with resp:
            try:
                body = resp.json()
            except ValueError:
                body = None
        if isinstance(body, dict) and body.get("status") == "success":
            for warning in body.get("warnings") or []:
                self.warnings.append(f"{what}: Prometheus warned: {self._scrub(str(warning))}")
            return body.get("data")
        reason = ""
        if isinstance(body, dict):
            reason = f"{body.get('errorType', 'error')}: {body.get('error', '')}".strip(": ")
        if resp.status_code in (401, 403):
            raise PrometheusQueryError(
                f"{self.display_url} answered HTTP {resp.status_code} to {what}" + (f" ({reason})" if reason else ""),
                "give credentials: --prometheus-token-env/--prometheus-token-file, --prometheus-user with "
                "--prometheus-password-env, or --header (e.g. 'X-Scope-OrgID: tenant' for Mimir)",
            )
        if resp.status_code == 404:
            raise PrometheusQueryError(
                f"{self.display_url} has no /api/v1/{path} (HTTP 404)",
                "give the Prometheus base URL (for Mimir, its /prometheus prefix)",
            )
        status = f"HTTP {resp.status_code}" if resp.status_code != 200 else "an error"
        raise PrometheusQueryError(
            f"Prometheus answered {status} to {what}: {self._scrub(reason) or (resp.reason or 'no error text')}"
        )

    def query(self, expr: str, at_unix: float) -> list[dict]:
        data = self.api("query", {"query": expr, "time": f"{at_unix:.3f}"}, f"the query {_short(expr)}")
        return _result(data, expr)

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[dict]:
        params = {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"}
        return _result(self.api("query_range", params, f"the range query {_short(expr)}"), expr)

    def series(self, match: str, start: float, end: float) -> list[dict[str, str]]:
        data = self.api("series", {"match[]": match, "start": f"{start:.3f}", "end": f"{end:.3f}"}, "the series lookup")
        return data if isinstance(data, list) else []

    def targets(self) -> list[dict] | None:
        """Active targets (Prometheus only; Mimir and Thanos have none): None when the API is not there."""
        self.queries += 1
        try:
            resp = self._client().get(
                f"{self.url}/api/v1/targets", params={"state": "active"}, timeout=self.timeout_seconds
            )
            body = resp.json() if resp.status_code == 200 else None
        except (requests.exceptions.RequestException, ValueError):
            return None
        if not isinstance(body, dict) or body.get("status") != "success":
            return None
        return body.get("data", {}).get("activeTargets") or []

    def curl(self, expr: str, at_unix: float | None = None, range_: tuple[float, float, float] | None = None) -> str:
        """The query as a curl line a person can run: credentials as shell variables, never their values."""
        parts = ["curl", "-s"]
        if self.token:
            var = self.token_from.split(" ", 1)[1] if self.token_from.startswith("env ") else "PROM_TOKEN"
            if self.token_from.startswith("file "):
                parts += ["-H", f'"Authorization: Bearer $(cat {shlex.quote(self.token_from[5:])})"']
            else:
                parts += ["-H", f'"Authorization: Bearer ${var}"']
        if self.username:
            var = self.password_from.split(" ", 1)[1] if self.password_from else "PROM_PASSWORD"
            parts += ["-u", f'"{self.username}:${var}"']
        for name in self.headers:
            value = "***" if name.lower() in ("authorization", "cookie", "x-api-key") else self.headers[name]
            parts += ["-H", shlex.quote(f"{name}: {value}")]
        if self.ca_file:
            parts += ["--cacert", shlex.quote(self.ca_file)]
        elif self.insecure:
            parts.append("-k")
        if range_ is None:
            endpoint = "query"
            params = [f"query={expr}"] + ([f"time={at_unix:.0f}"] if at_unix is not None else [])
        else:
            endpoint = "query_range"
            params = [f"query={expr}", f"start={range_[0]:.0f}", f"end={range_[1]:.0f}", f"step={range_[2]:g}"]
        parts.append(shlex.quote(f"{self.display_url}/api/v1/{endpoint}"))
        for param in params:
            parts += ["--data-urlencode", shlex.quote(param)]
        return " ".join(parts)


def _short(expr: str, limit: int = 90) -> str:
    return expr if len(expr) <= limit else expr[: limit - 1] + "…"


def _result(data: Any, expr: str) -> list[dict]:
    if not isinstance(data, dict) or data.get("resultType") not in ("vector", "matrix"):
        raise PrometheusQueryError(f"Prometheus answered {_short(expr)} with no vector or matrix")
    return data.get("result") or []


# --------------------------------------------------------------------------------------------------------------------
# times, windows and the selector


DURATION_RE = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")
UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}


def parse_duration(text: str, what: str = "duration") -> float:
    """'90s', '5m', '1h30m', '500ms', or plain seconds."""
    raw = text.strip()
    try:
        value = float(raw)
    except ValueError:
        pieces = DURATION_RE.findall(raw)
        if not pieces or "".join(n + u for n, u in pieces) != raw:
            raise UsageError(f"{what} '{text}' is not a duration", "e.g. 90s, 5m, 1h30m") from None
        value = sum(float(n) * UNIT_SECONDS[u] for n, u in pieces)
    if value <= 0:
        raise UsageError(f"{what} '{text}' must be positive", "e.g. 90s, 5m, 1h30m")
    return value


def parse_time(text: str, what: str = "time", now: float | None = None) -> float:
    """Unix seconds, an ISO 8601 time (a naive one is local time), a time of day (HH:MM[:SS], the last one), 'now',
    or a span ago ('10m' = ten minutes ago)."""
    now = time.time() if now is None else now
    raw = text.strip()
    if raw == "now":
        return now
    try:
        value = float(raw)
        if value > 1e8:  # unix seconds; smaller numbers read as seconds ago
            return value
        return now - value
    except ValueError:
        pass
    try:
        return datetime.fromisoformat(raw.replace("Z", "+00:00")).timestamp()
    except ValueError:
        pass
    if re.fullmatch(r"\d{1,2}:\d{2}(:\d{2})?", raw):  # a time of day: today's, or yesterday's if still to come
        hms = [int(x) for x in raw.split(":")] + [0]
        today = datetime.fromtimestamp(now).replace(hour=hms[0], minute=hms[1], second=hms[2], microsecond=0)
        stamp = today.timestamp()
        return stamp if stamp <= now else stamp - 86400.0
    try:
        return now - parse_duration(raw.removesuffix(" ago").removesuffix("ago").strip().lstrip("-"), what)
    except UsageError:
        hint = "give unix seconds, an ISO time (2025-01-31T14:05:00Z) or a span ago (10m)"
        raise UsageError(f"{what} '{text}' is not a time", hint) from None


def selector_matchers(selector: str | None) -> str:
    """'{job="vllm"}' or 'job="vllm"' → 'job="vllm"' (the inside of the braces); None or '' → ''."""
    if not selector:
        return ""
    inner = selector.strip()
    if inner.startswith("{"):
        if not inner.endswith("}"):
            raise UsageError(f"--selector '{selector}' has no closing brace", "e.g. --selector '{job=\"vllm\"}'")
        inner = inner[1:-1]
    inner = inner.strip().strip(",")
    if inner and not re.match(r"^\s*[A-Za-z_][A-Za-z0-9_]*\s*(=~|!~|!=|=)\s*\"", inner):
        raise UsageError(
            f"--selector '{selector}' is not a label matcher list", 'e.g. --selector \'{job="vllm",namespace="prod"}\''
        )
    return inner


def simple_matchers(inner: str) -> dict[str, str]:
    """The ``label="value"`` equality matchers of a selector (to pick its targets' scrape interval)."""
    return dict(re.findall(r'([A-Za-z_][A-Za-z0-9_]*)\s*=\s*"([^"]*)"', inner))


def _vector(name: str, inner: str, extra: dict[str, str] | None = None) -> str:
    matchers = [inner] if inner else []
    matchers += [f'{k}="{_escape(v)}"' for k, v in sorted((extra or {}).items())]
    return f"{name}{{{','.join(matchers)}}}" if matchers else name


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')


def _dur(seconds: float) -> str:
    """Seconds as a PromQL duration: whole milliseconds."""
    ms = max(1, int(round(seconds * 1000)))
    return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"


# --------------------------------------------------------------------------------------------------------------------
# results


@dataclass
class PrometheusResult:
    """One evaluation: a SignalSet per instance (key: 'job/instance', or 'namespace/pod' in Kubernetes)."""

    instances: dict[str, SignalSet] = field(default_factory=dict)
    queries: int = 0  # HTTP requests made to the query API for this result (a timeline: for all its steps)
    notes: list[str] = field(default_factory=list)
    scrape_interval_seconds: float | None = None
    window_seconds: float | None = None
    end_unix: float | None = None
    prometheus_url: str = ""


@dataclass
class _Plan:
    """What one evaluation asks: the window and, per instance, which server and which wire names it has."""

    inner: str
    end: float
    window: float
    interval: float
    # instance key → its instance labels
    labels: dict[str, dict[str, str]] = field(default_factory=dict)
    # instance key → metric names seen for it in the window
    names: dict[str, set[str]] = field(default_factory=dict)
    # instance key → probe name (vllm, sglang …), or None: nothing recognised
    probe: dict[str, str | None] = field(default_factory=dict)
    dcgm_names: set[str] = field(default_factory=set)
    dcgm_groups: list[dict[str, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def instance_key(labels: dict[str, str]) -> str:
    if labels.get("pod"):
        return f"{labels['namespace']}/{labels['pod']}" if labels.get("namespace") else labels["pod"]
    job, inst = labels.get("job", ""), labels.get("instance", "")
    return f"{job}/{inst}" if job and inst else (inst or job or "(no instance label)")


def _wire_candidates(spec: SignalSpec) -> list[str]:
    """The names a signal may be stored under in Prometheus (histograms: their _count series)."""
    return [m + "_count" if spec.kind == "histogram" else m for m in spec.metrics]


def _all_names(spec: ProbeSpec) -> set[str]:
    names = {n for s in spec.signal for n in _wire_candidates(s)}
    names |= {s.divide_by for s in spec.signal if s.divide_by}
    if spec.config_metric:
        names.add(spec.config_metric)
    return names


def _name_regex(names: set[str]) -> str:
    return "|".join(re.escape(n).replace("\\:", ":") for n in sorted(names))


def _chosen_wire(spec: SignalSpec, names: set[str]) -> str | None:
    for metric, candidate in zip(spec.metrics, _wire_candidates(spec), strict=True):
        if candidate in names:
            return metric
    return None


def discover_interval(source: PrometheusSource, inner: str, notes: list[str]) -> float:
    """The scrape interval of the selected targets: /api/v1/targets, else sample spacing, else 15 s (noted)."""
    targets = source.targets()
    wanted = simple_matchers(inner)
    if targets:
        chosen = [t for t in targets if all(t.get("labels", {}).get(k) == v for k, v in wanted.items())] or targets
        intervals = [parse_duration(t["scrapeInterval"]) for t in chosen if t.get("scrapeInterval")]
        if intervals:
            return max(intervals)
    try:  # Mimir, Thanos: no targets API; the spacing of `up`'s samples over 5 minutes
        rows = source.query(f"max(count_over_time({_vector('up', inner)}[5m]))", time.time())
        count = float(rows[0]["value"][1]) if rows else 0.0
        if count >= 2:
            return 300.0 / count
    except PrometheusQueryError:
        pass
    notes.append(f"scrape interval unknown (no targets API, no 'up' samples): assumed {FALLBACK_INTERVAL_SECONDS:g} s")
    return FALLBACK_INTERVAL_SECONDS


def _plan(source: PrometheusSource, inner: str, end: float, span: float, interval: float) -> _Plan:
    """Which instances the selector has over [end - span, end], which server each runs, and the DCGM series."""
    plan = _Plan(inner=inner, end=end, window=span, interval=interval)
    server_specs = [load_probe(name) for name in SERVER_PROBES]
    names = set().union(*(_all_names(s) for s in server_specs))
    selector = "{" + ",".join([f'__name__=~"{_name_regex(names)}"'] + ([inner] if inner else [])) + "}"
    rows = source.series(selector, end - span, end)
    up = source.series("{" + ",".join(['__name__="up"'] + ([inner] if inner else [])) + "}", end - span, end)
    for labels in [*rows, *up]:
        own = {k: labels[k] for k in INSTANCE_LABELS if labels.get(k)}
        key = instance_key(own)
        plan.labels.setdefault(key, own)
        plan.names.setdefault(key, set())
        if labels.get("__name__") != "up":
            plan.names[key].add(labels["__name__"])
    for key, seen in plan.names.items():
        best, score = None, 0
        for spec in server_specs:
            hits = sum(1 for n in seen if n.startswith(tuple(spec.detect_prefixes)))
            if hits > score:
                best, score = spec.name, hits
        plan.probe[key] = best
    dcgm = load_probe("dcgm")
    dcgm_rows = source.series("{" + f'__name__=~"{_name_regex(_all_names(dcgm))}"' + "}", end - span, end)
    plan.dcgm_names = {r["__name__"] for r in dcgm_rows}
    groups: dict[tuple, dict[str, str]] = {}
    for r in dcgm_rows:
        group = {k: r[k] for k in ("job", "instance", "namespace", "pod", "Hostname", "hostname") if r.get(k)}
        groups.setdefault(tuple(sorted(group.items())), group)
    plan.dcgm_groups = list(groups.values())
    return plan


# --------------------------------------------------------------------------------------------------------------------
# queries


@dataclass
class _Query:
    """One PromQL expression and where its answer goes."""

    expr: str
    kind: str  # counter | gauge | histogram | info
    wire: str
    mode: str  # instant | range
    step: float = 0.0
    failure: str | None = None
    rows: list[dict] = field(default_factory=list)
    # instance key → its rows, each with "pts": {unix time (ms-rounded): value}
    index: dict[str, list[dict]] = field(default_factory=dict)

    def keep(self, rows: list[dict]) -> None:
        self.rows = rows
        for row in rows:
            raw = row["values"] if "values" in row else [row["value"]]
            row["pts"] = {round(float(t), 3): float(v) for t, v in raw if not math.isnan(float(v))}
            own = {k: row["metric"][k] for k in INSTANCE_LABELS if row["metric"].get(k)}
            self.index.setdefault(instance_key(own), []).append(row)


def _group_by(extra: list[str]) -> str:
    return ", ".join([*INSTANCE_LABELS, *extra])


def _histogram_expr(wire: str, inner: str, match: dict[str, str], window: str) -> str:
    by = _group_by(sorted(match))
    bucket = f"sum by ({by}, le) (rate({_vector(wire + '_bucket', inner, match)}[{window}]))"
    parts = [f'label_replace(histogram_quantile({q:g}, {bucket}), "{TAG}", "{key}", "", "")' for q, key in QUANTILES]
    parts.append(
        f"label_replace(sum by ({by}, le) (increase({_vector(wire + '_bucket', inner, match)}[{window}])), "
        f'"{TAG}", "bucket", "", "")'
    )
    parts.append(
        f"label_replace(sum by ({by}) (increase({_vector(wire + '_sum', inner, match)}[{window}])), "
        f'"{TAG}", "sum", "", "")'
    )
    return " or ".join(parts)


class _Runner:
    """Builds the queries for a plan (deduplicated), runs them, and keeps each one's rows or failure."""

    def __init__(self, source: PrometheusSource, plan: _Plan, timeline_step: float | None) -> None:
        self.source = source
        self.plan = plan
        self.timeline_step = timeline_step
        self.queries: dict[tuple[str, str, tuple], _Query] = {}
        if timeline_step is None:
            self.gauge_step = max(plan.interval, plan.window / MAX_GAUGE_POINTS)
        else:
            self.gauge_step = timeline_step

    def window_text(self) -> str:
        return _dur(self.timeline_step if self.timeline_step is not None else self.plan.window)

    def want(self, spec: SignalSpec, wire: str, inner: str) -> _Query:
        """The query for one signal's wire name (shared by signals reading the same name)."""
        w = self.window_text()
        if spec.kind == "counter":
            expr, kind = f"increase({_vector(wire, inner)}[{w}])", "counter"
        elif spec.kind == "histogram":
            expr, kind = _histogram_expr(wire, inner, spec.match, w), "histogram"
        elif spec.kind == "info":
            expr, kind = f"last_over_time({_vector(wire, inner)}[{w}])", "info"
        else:
            fn = "last_over_time"
            averaged = self.gauge_step > self.plan.interval * 1.5 and spec.any_bits is None
            if averaged:
                fn = "avg_over_time"
            expr, kind = f"{fn}({_vector(wire, inner)}[{_dur(self.gauge_step)}])", "gauge"
        mode = "range" if kind == "gauge" or self.timeline_step is not None else "instant"
        key = (expr, mode, ())
        if key not in self.queries:
            self.queries[key] = _Query(expr=expr, kind=kind, wire=wire, mode=mode, step=self.gauge_step)
        return self.queries[key]

    def run(self) -> None:
        plan = self.plan
        for query in self.queries.values():
            try:
                if query.mode == "instant":
                    query.keep(self.source.query(query.expr, plan.end))
                else:
                    start = plan.end - plan.window + (query.step if self.timeline_step is not None else 0.0)
                    query.keep(self.source.query_range(query.expr, start, plan.end, query.step))
            except PrometheusQueryError as exc:
                query.failure = exc.message
                plan.notes.append(exc.message)

    def verify(self, query: _Query) -> str:
        plan = self.plan
        if query.mode == "instant":
            return self.source.curl(query.expr, plan.end)
        return self.source.curl(query.expr, range_=(plan.end - plan.window, plan.end, query.step))


# --------------------------------------------------------------------------------------------------------------------
# turning query rows into signals


def _scrapes_for(
    query: _Query, rows: list[dict], times: list[float], start_of: dict[float, float]
) -> dict[float, list[Scrape]]:
    """For each evaluation time: the scrapes SignalBuilder reads for this query's rows (one instance's rows)."""
    out: dict[float, list[Scrape]] = {}
    wire = query.wire
    for t in times:
        scrapes: list[Scrape] = []
        if query.kind == "gauge":
            by_time: dict[float, dict[LabelKey, float]] = {}
            for row in rows:
                key = label_key(row["metric"], drop=("__name__",))
                for pt, value in row["pts"].items():
                    if start_of[t] + 1e-3 < pt <= t + 1e-3:
                        by_time.setdefault(pt, {})[key] = value
            scrapes = [Scrape(at_unix=pt, series={wire: series}) for pt, series in sorted(by_time.items())]
        elif query.kind in ("counter", "info"):
            series = {}
            for row in rows:
                key = label_key(row["metric"], drop=("__name__",))
                value = row["pts"].get(round(t, 3))
                if value is not None:
                    series[key] = value
            if series:
                zero = Scrape(at_unix=start_of[t], series={wire: dict.fromkeys(series, 0.0)})
                scrapes = [zero, Scrape(at_unix=t, series={wire: series})]
        out[t] = scrapes
    return out


def _histogram_parts(rows: list[dict], t: float) -> tuple[dict[str, dict[LabelKey, float]], dict[str, float]]:
    """The histogram query's rows at time t: bucket/sum/count series (as a scrape holds them) and the quantiles."""
    series: dict[str, dict[LabelKey, float]] = {"_bucket": {}, "_sum": {}, "_count": {}}
    quantiles: dict[str, float] = {}
    for row in rows:
        labels = dict(row["metric"])
        part = labels.pop(TAG, "")
        value = row["pts"].get(round(t, 3))
        if value is None:
            continue
        if part == "bucket":
            series["_bucket"][label_key(labels)] = value
            if labels.get("le") == "+Inf":
                series["_count"][label_key(labels, drop=("le",))] = value
        elif part == "sum":
            series["_sum"][label_key(labels)] = value
        elif part:
            quantiles[part] = value
    return series, quantiles


class _InstanceBuilder:
    """One instance's SignalSet at one evaluation time, from the runner's query rows."""

    def __init__(self, runner: _Runner, key: str, t: float, window: float) -> None:
        self.runner, self.key, self.t, self.window = runner, key, t, window
        self.start = t - window
        self.own = runner.plan.labels[key]
        self.where = f"prometheus {runner.source.display_url}: {key}"

    def rows(self, query: _Query, match=None) -> list[dict]:
        if match is not None:
            return [r for r in query.rows if match(r["metric"])]
        return query.index.get(self.key, [])

    def signal(
        self, probe: ProbeSpec, spec: SignalSpec, wire: str | None, inner: str, match=None
    ) -> tuple[Signal, list[str]]:
        if wire is None:
            reason = (
                f"no series in Prometheus for this instance in the window (looked for "
                f"{', '.join(_wire_candidates(spec))})"
            )
            if spec.missing_note:
                reason += f"; {spec.missing_note}"
            return Signal.missing(spec.name, spec.kind, spec.unit, reason), []
        query = self.runner.want(spec, wire, inner)
        if query.failure is not None:
            return Signal.missing(
                spec.name,
                spec.kind,
                spec.unit,
                f"the Prometheus query failed: {query.failure}",
                source=f"prometheus: {query.expr}",
            ), []
        rows = self.rows(query, match=match)
        common = {"source": f"prometheus: {query.expr}", "verify": spec.verify or self.runner.verify(query)}
        if spec.kind == "histogram":
            parts, quantiles = _histogram_parts(rows, self.t)
            scrapes = [
                Scrape(at_unix=self.start, series={wire + s: dict.fromkeys(v, 0.0) for s, v in parts.items()}),
                Scrape(at_unix=self.t, series={wire + s: v for s, v in parts.items()}),
            ]
        else:
            by_t = _scrapes_for(query, rows, [self.t], {self.t: self.start})
            scrapes = by_t[self.t]
            if spec.divide_by and scrapes:
                other = self.runner.want(
                    SignalSpec(name="_d", kind="gauge", unit="x", metrics=[spec.divide_by], help="-"),
                    spec.divide_by,
                    inner,
                )
                extra = _scrapes_for(other, self.rows(other, match=match), [self.t], {self.t: self.start})[self.t]
                extra_at = {s.at_unix: s.series for s in extra}
                for s in scrapes:
                    s.series.update(extra_at.get(s.at_unix, {}))
        if not scrapes:
            why = "no samples in the window" if rows or query.kind != "histogram" else "no buckets in the window"
            return Signal.missing(
                spec.name,
                spec.kind,
                spec.unit,
                f"Prometheus has {wire} but {why} for this instance",
                source=common["source"],
            ), []
        builder = SignalBuilder(probe, scrapes, self.where)
        signal = builder.build(spec)
        signal.source, signal.verify = common["source"], common["verify"]
        signal.window_seconds = self.window
        if spec.kind == "counter" and signal.unavailable is None:
            signal.samples = []  # one point at the window's end says nothing a chart needs
        if spec.kind == "histogram" and signal.unavailable is None:
            for key, value in quantiles.items():
                if not math.isnan(value) and not math.isinf(value):
                    signal.stats[key] = value * spec.scale
        return signal, builder.anomalies


def _source_info(probe: ProbeSpec, runner: _Runner, key: str, builder: _InstanceBuilder) -> SourceInfo:
    models: set[str] = set()
    engines: set[str] = set()
    config: dict[str, str] = {}
    for query in runner.queries.values():
        for row in builder.rows(query):
            labels = row["metric"]
            if "model_name" in labels:
                models.add(labels["model_name"])
            if "engine" in labels:
                engines.add(labels["engine"])
            elif "dp_rank" in labels:
                engines.add(labels["dp_rank"])
            if probe.config_metric and query.wire == probe.config_metric and query.kind == "info" and not config:
                config = {k: v for k, v in labels.items() if k not in (*INSTANCE_LABELS, "__name__", "model_name")}
    return SourceInfo(
        probe=probe.name,
        url=builder.where,
        server=probe.server,
        models=sorted(models),
        engines=sorted(engines, key=lambda e: (len(e), e)),
        config=config,
        note="; ".join(["read through Prometheus", *probe.notes]),
    )


def _dcgm_host(group: dict[str, str]) -> str:
    return group.get("Hostname") or group.get("hostname") or group.get("instance", "").rsplit(":", 1)[0]


def _server_host(own: dict[str, str]) -> str:
    inst = own.get("instance", "")
    if inst.startswith("["):
        return inst[1:].split("]", 1)[0]
    return inst.rsplit(":", 1)[0] if inst.count(":") == 1 else inst


def _join_dcgm(plan: _Plan, key: str) -> tuple[list[dict[str, str]], str]:
    """The DCGM groups (one per exporter target) that belong to this instance, and how they were joined."""
    own = plan.labels[key]
    if own.get("pod"):
        space = own.get("namespace")
        by_pod = [
            g
            for g in plan.dcgm_groups
            if g.get("pod") == own["pod"] and (not space or g.get("namespace", space) == space)
        ]
        if by_pod:
            return by_pod, f"pod {own['pod']}"
    host = _server_host(own)
    by_host = [g for g in plan.dcgm_groups if host and _dcgm_host(g) == host]
    if by_host:
        return by_host, f"host {host}"
    return [], ""


def _dcgm_signals(runner: _Runner, plan: _Plan, key: str, t: float, window: float) -> SignalSet | SourceInfo:
    dcgm = load_probe("dcgm")
    if not plan.dcgm_names:
        return SourceInfo(
            probe="dcgm",
            server="DCGM exporter",
            ok=False,
            note="DCGM exporter: no DCGM_* series in this Prometheus for the window",
        )
    groups, how = _join_dcgm(plan, key)
    if not groups:
        hosts = sorted({_dcgm_host(g) for g in plan.dcgm_groups})
        pods = sorted({g["pod"] for g in plan.dcgm_groups if g.get("pod")})
        seen = f"hosts {', '.join(hosts[:5])}" + (f"; pods {', '.join(pods[:5])}" if pods else "")
        return SourceInfo(
            probe="dcgm",
            server="DCGM exporter",
            ok=False,
            note=f"DCGM exporter: GPU series are in Prometheus but none share a pod or host with {key} "
            f"(its host {_server_host(plan.labels[key]) or '?'}; DCGM {seen})",
        )
    group_keys = [tuple(sorted(g.items())) for g in groups]

    def mine(labels: dict[str, str]) -> bool:
        return any(all(labels.get(k) == v for k, v in g) for g in group_keys)

    builder = _InstanceBuilder(runner, key, t, window)
    builder.where = f"prometheus {runner.source.display_url}: DCGM joined by {how}"
    out = SignalSet()
    anomalies: list[str] = []
    for spec in dcgm.signal:
        signal, found = builder.signal(dcgm, spec, _chosen_wire(spec, plan.dcgm_names), "", match=mine)
        out.add(signal)
        anomalies += found
    out.anomalies = anomalies
    sharing = [k for k in plan.labels if k != key and _join_dcgm(plan, k)[0] == groups]
    note = f"DCGM series from Prometheus, joined by {how}"
    if sharing:
        note += f"; shared with {len(sharing)} other instance(s) there: GPU figures are that {how.split()[0]}'s"
    out.sources.append(SourceInfo(probe="dcgm", url=builder.where, server="DCGM exporter", note=note))
    return out


# --------------------------------------------------------------------------------------------------------------------
# the public functions


def choose_window(interval: float, span: float | None) -> tuple[float, str]:
    """W from the requested span and the scrape interval: at least MIN_WINDOW_INTERVALS intervals."""
    floor = MIN_WINDOW_INTERVALS * interval
    if span is None:
        return max(DEFAULT_WINDOW_SECONDS, floor), ""
    if span < floor:
        return floor, (
            f"the requested {span:g} s is under {MIN_WINDOW_INTERVALS} scrape intervals "
            f"({interval:g} s each): widened to {floor:g} s"
        )
    return span, ""


def _evaluate(
    source: PrometheusSource, plan: _Plan, runner: _Runner, times: list[float], window: float, inner: str
) -> list[dict[str, SignalSet]]:
    """Declare every query (first pass), run them, then build each instance's SignalSet at each time."""
    server_specs = {name: load_probe(name) for name in SERVER_PROBES}
    dcgm = load_probe("dcgm")
    # first pass: declare the queries the instances need
    for key, probe in plan.probe.items():
        if probe is None:
            continue
        for spec in server_specs[probe].signal:
            wire = _chosen_wire(spec, plan.names[key])
            if wire is not None:
                runner.want(spec, wire, inner)
                if spec.divide_by:
                    runner.want(
                        SignalSpec(name="_d", kind="gauge", unit="x", metrics=[spec.divide_by], help="-"),
                        spec.divide_by,
                        inner,
                    )
    if plan.dcgm_names and plan.dcgm_groups and any(_join_dcgm(plan, k)[0] for k in plan.probe):
        for spec in dcgm.signal:
            wire = _chosen_wire(spec, plan.dcgm_names)
            if wire is not None:
                runner.want(spec, wire, "")
    runner.run()
    out: list[dict[str, SignalSet]] = []
    for t in times:
        sets: dict[str, SignalSet] = {}
        for key in sorted(plan.labels):
            sets[key] = _instance_set(runner, plan, key, t, window, server_specs, inner)
        out.append(sets)
    return out


def _instance_set(
    runner: _Runner, plan: _Plan, key: str, t: float, window: float, server_specs: dict[str, ProbeSpec], inner: str
) -> SignalSet:
    probe_name = plan.probe.get(key)
    builder = _InstanceBuilder(runner, key, t, window)
    signal_set = SignalSet()
    signal_set.window = Window(
        kind="window",
        start_unix=t - window,
        end_unix=t,
        duration_seconds=window,
        scrapes=max(1, int(round(window / plan.interval))),
        note=f"read from Prometheus: PromQL over [{_dur(window)}] ending at "
        f"{datetime.fromtimestamp(t).isoformat(timespec='seconds')}",
    )
    if probe_name is None:
        seen = sorted(plan.names.get(key, set()))
        reason = (
            "Prometheus has this target (up) but no inference-server series from it in the window"
            if not seen
            else f"unrecognised server series ({', '.join(seen[:3])} …)"
        )
        spec = server_specs["vllm"]
        for s in spec.signal:
            signal_set.add(Signal.missing(s.name, s.kind, s.unit, reason))
        signal_set.sources.append(
            SourceInfo(probe="prometheus", url=builder.where, server="unknown", ok=False, note=reason)
        )
        return signal_set
    probe = server_specs[probe_name]
    for spec in probe.signal:
        signal, anomalies = builder.signal(probe, spec, _chosen_wire(spec, plan.names[key]), inner)
        signal_set.add(signal)
        signal_set.anomalies += anomalies
    from llmdiag.collect.signals import _by_design

    for fixed in probe.by_design:
        signal_set.add(_by_design(probe, fixed, window))
    for name, help_text in (
        (
            "counter_resets",
            "counters or histograms that went backwards in the window (PromQL's increase() handles resets)",
        ),
        ("implausible_samples", "gauge samples outside their valid range"),
    ):
        signal_set.add(Signal(name=name, kind="derived", unit="count", stats={"value": 0.0}, source=help_text))
    signal_set.sources.append(_source_info(probe, runner, key, builder))
    gpu = _dcgm_signals(runner, plan, key, t, window)
    if isinstance(gpu, SourceInfo):
        signal_set.sources.append(gpu)
    else:
        from llmdiag.collect.metrics import merge_signal_sets

        merge_signal_sets(signal_set, gpu)
    if probe_name in ("trtllm", "triton"):
        signal_set.anomalies.append(
            f"{probe.server} through Prometheus: only its Prometheus series are read; the JSON iteration statistics "
            "(and what llmdiag estimates from them) are not there"
        )
    return signal_set


def _prepare(
    source: PrometheusSource, selector: str | None, end: float, span: float, interval: float | None = None
) -> tuple[_Plan, str]:
    inner = selector_matchers(selector)
    notes: list[str] = []
    if interval is None:
        interval = discover_interval(source, inner, notes)
    plan = _plan(source, inner, end, span, interval)
    plan.notes = notes + plan.notes
    if not plan.labels:
        where = f" matching {{{inner}}}" if inner else ""
        raise PrometheusQueryError(
            f"Prometheus at {source.display_url} has no inference-server series and no targets{where} between "
            f"{datetime.fromtimestamp(end - span).isoformat(timespec='seconds')} and "
            f"{datetime.fromtimestamp(end).isoformat(timespec='seconds')}",
            "check --selector (e.g. '{job=\"vllm\"}') and the time range; list the jobs with: "
            f"curl -s {source.display_url}/api/v1/label/job/values",
        )
    return plan, inner


def collect_prometheus(
    source: PrometheusSource,
    selector: str | None = None,
    at_unix: float | None = None,
    window_seconds: float | None = None,
) -> PrometheusResult:
    """Each instance's SignalSet over [at - W, at] (at: now when None). ``window_seconds`` None: the default window
    (60 s, or 4 scrape intervals when longer); a span shorter than 4 intervals is widened, and a note says so."""
    before = source.queries
    notes: list[str] = []
    end = round(time.time() if at_unix is None else at_unix, 3)
    inner = selector_matchers(selector)
    interval = discover_interval(source, inner, notes)
    window, why = choose_window(interval, window_seconds)
    if why:
        notes.append(why)
    plan, inner = _prepare(source, selector, end, window, interval)
    runner = _Runner(source, plan, None)
    sets = _evaluate(source, plan, runner, [end], window, inner)[0]
    notes += plan.notes + source.warnings
    for signal_set in sets.values():
        signal_set.anomalies += [n for n in plan.notes if n.startswith("Prometheus answered")]
    return PrometheusResult(
        instances=sets,
        queries=source.queries - before,
        notes=notes,
        scrape_interval_seconds=interval,
        window_seconds=window,
        end_unix=end,
        prometheus_url=source.display_url,
    )


def collect_prometheus_timeline(
    source: PrometheusSource,
    selector: str | None,
    start_unix: float,
    end_unix: float,
    step_seconds: float | None = None,
) -> list[tuple[float, PrometheusResult]]:
    """The fleet at each step of [start, end]: at time t, each instance's SignalSet over [t - step, t]. The queries
    are range queries, so their number does not grow with the steps or the fleet. ``step_seconds`` None: about
    30 steps, and never under 4 scrape intervals."""
    if end_unix <= start_unix:
        raise UsageError("--to must be after --from", "e.g. --from 2025-01-31T14:00:00 --to 2025-01-31T15:00:00")
    before = source.queries
    notes: list[str] = []
    inner = selector_matchers(selector)
    interval = discover_interval(source, inner, notes)
    span = end_unix - start_unix
    step = step_seconds if step_seconds is not None else span / DEFAULT_TIMELINE_STEPS
    floor = MIN_WINDOW_INTERVALS * interval
    if step < floor:
        if step_seconds is not None:
            notes.append(
                f"--step {step_seconds:g} s is under {MIN_WINDOW_INTERVALS} scrape intervals: widened to {floor:g} s"
            )
        step = floor
    if span < step:
        raise UsageError(
            f"the range ({span:g} s) is shorter than one step ({step:g} s)",
            "widen --from/--to or give a smaller --step",
        )
    step = round(step, 3)
    start_unix = round(start_unix, 3)
    count = int(span // step)
    end = round(start_unix + count * step, 3)
    times = [round(start_unix + (i + 1) * step, 3) for i in range(count)]
    plan, inner = _prepare(source, selector, end, end - start_unix, interval)
    plan.window = end - start_unix
    runner = _Runner(source, plan, step)
    per_time = _evaluate(source, plan, runner, times, step, inner)
    notes += plan.notes + source.warnings
    queries = source.queries - before
    out: list[tuple[float, PrometheusResult]] = []
    for t, sets in zip(times, per_time, strict=True):
        result = PrometheusResult(
            instances=sets,
            queries=queries,
            notes=notes,
            scrape_interval_seconds=interval,
            window_seconds=step,
            end_unix=t,
            prometheus_url=source.display_url,
        )
        out.append((t, result))
    return out
