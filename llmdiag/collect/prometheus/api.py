"""The HTTP side: a Prometheus-compatible query API (Prometheus, Mimir, Thanos), its auth, TLS and errors."""

from __future__ import annotations

import math
import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests

from llmdiag.client.deadline import Deadline, call_within, deadline_session, request_deadline
from llmdiag.client.endpoint import normalise_base_url, parse_header, redact_url
from llmdiag.errors import ConnectError, ProbeTimeout, PrometheusQueryError, UsageError, option

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
            raise UsageError(f"give the Prometheus token once: {option('token_env')} or {option('token_file')}")
        if token_env:
            token = os.environ.get(token_env)
            if not token:
                raise UsageError(
                    f"{option('token_env')} {token_env}: that variable is not set or empty",
                    f"export {token_env}=... before running llmdiag",
                )
            token_from = f"env {token_env}"
        elif token_file:
            try:
                token = token_file.read_text(encoding="utf-8").strip()
            except OSError as exc:
                raise UsageError(f"{option('token_file')} {token_file}: {exc.strerror or exc}") from None
            if not token:
                raise UsageError(f"{option('token_file')} {token_file} is empty")
            token_from = f"file {token_file}"
        password, password_from = None, ""
        if password_env and not user:
            raise UsageError(f"{option('password_env')} needs {option('user')}")
        if user:
            if not password_env:
                raise UsageError(f"{option('user')} needs {option('password_env')} NAME (the password's variable)")
            password = os.environ.get(password_env)
            if password is None:
                raise UsageError(f"{option('password_env')} {password_env}: that variable is not set")
            password_from = f"env {password_env}"
        if token and user:
            raise UsageError("give either a bearer token or basic auth for Prometheus, not both")
        if ca_file is not None and not ca_file.is_file():
            raise UsageError(f"{option('ca_file')} {ca_file}: no such file", "give the CA bundle as a PEM file")
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
            session = deadline_session()
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
        deadline = request_deadline(self.timeout_seconds)
        status, reason_text, body = call_within(
            deadline,
            lambda: self._post(url, params, what, deadline),
            lambda: ProbeTimeout(
                f"Prometheus at {self.display_url} did not finish answering {what} within {deadline.describe()}",
                f"narrow {option('selector')} or the time range, or raise {option('timeout_seconds')}",
            ),
        )
        if isinstance(body, dict) and body.get("status") == "success":
            for warning in body.get("warnings") or []:
                self.warnings.append(f"{what}: Prometheus warned: {self._scrub(str(warning))}")
            return body.get("data")
        return self._refused(path, what, status, reason_text, body)

    def _post(self, url: str, params: dict[str, str], what: str, deadline: Deadline) -> tuple[int, str, Any]:
        """One POST and its JSON answer (None when it is not JSON): (status, reason, body). A redirect is not
        followed: the credentials must not go to another host."""
        try:
            client = self._client()
            resp = client.post(
                url,
                data=params,
                timeout=deadline.cap(self.timeout_seconds),
                allow_redirects=False,
                verify=client.verify,  # per request: requests lets REQUESTS_CA_BUNDLE override the session's
            )
        except requests.exceptions.SSLError:
            raise ConnectError(
                f"TLS handshake with {self.display_url} failed",
                f"give the CA with {option('ca_file')} FILE, or pass {option('insecure')}",
            ) from None
        except requests.exceptions.Timeout:
            raise ProbeTimeout(
                f"{self.display_url} did not answer {what} within {self.timeout_seconds:g} s",
                f"narrow {option('selector')} or the time range",
            ) from None
        except requests.exceptions.ConnectionError:
            raise ConnectError(
                f"cannot connect to Prometheus at {self.display_url}",
                f"is the URL right? e.g. {option('prometheus')} http://prometheus:9090",
            ) from None
        except requests.exceptions.RequestException as exc:
            raise ConnectError(f"request to {self.display_url} failed: {type(exc).__name__}") from None
        with resp:
            if resp.is_redirect:
                raise ConnectError(
                    f"Prometheus at {self.display_url} redirects {what} (HTTP {resp.status_code}) to "
                    f"{redact_url(resp.headers.get('Location', '?'))}; not followed, so that no credentials go there",
                    f"give the URL it redirects to as {option('prometheus')}",
                )
            try:
                body = resp.json()
            except (ValueError, RecursionError):  # not JSON, or nested deeper than the stack
                body = None
            return resp.status_code, resp.reason or "", body

    def _refused(self, path: str, what: str, status_code: int, reason_text: str, body: Any) -> Any:
        """The PrometheusQueryError for an answer that is not a success, in plain words."""
        reason = ""
        if isinstance(body, dict):
            reason = f"{body.get('errorType', 'error')}: {body.get('error', '')}".strip(": ")
        if status_code in (401, 403):
            raise PrometheusQueryError(
                f"{self.display_url} answered HTTP {status_code} to {what}" + (f" ({reason})" if reason else ""),
                f"give credentials: {option('token_env')}/{option('token_file')}, {option('user')} with "
                f"{option('password_env')}, or {option('headers')} (e.g. 'X-Scope-OrgID: tenant' for Mimir)",
            )
        if status_code == 404:
            raise PrometheusQueryError(
                f"{self.display_url} has no /api/v1/{path} (HTTP 404)",
                "give the Prometheus base URL (for Mimir, its /prometheus prefix)",
            )
        status = f"HTTP {status_code}" if status_code != 200 else "an error"
        raise PrometheusQueryError(
            f"Prometheus answered {status} to {what}: {self._scrub(reason) or (reason_text or 'no error text')}"
        )

    def query(self, expr: str, at_unix: float) -> list[dict]:
        data = self.api("query", {"query": expr, "time": f"{at_unix:.3f}"}, f"the query {_short(expr)}")
        return _result(data, expr)

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[dict]:
        params = {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"}
        return _result(self.api("query_range", params, f"the range query {_short(expr)}"), expr)

    def series(self, match: str, start: float, end: float) -> list[dict[str, str]]:
        data = self.api("series", {"match[]": match, "start": f"{start:.3f}", "end": f"{end:.3f}"}, "the series lookup")
        return _label_sets(data)

    def targets(self) -> list[dict] | None:
        """Active targets (Prometheus only; Mimir and Thanos have none): None when the API is not there."""
        self.queries += 1
        deadline = request_deadline(self.timeout_seconds)

        def get() -> Any:
            client = self._client()
            resp = client.get(
                f"{self.url}/api/v1/targets",
                params={"state": "active"},
                timeout=deadline.cap(self.timeout_seconds),
                allow_redirects=False,
                verify=client.verify,
            )
            with resp:
                return resp.json() if resp.status_code == 200 else None

        try:
            body = call_within(deadline, get, lambda: ProbeTimeout("late"))
        except (requests.exceptions.RequestException, ValueError, RecursionError, ProbeTimeout):
            return None
        if not isinstance(body, dict) or body.get("status") != "success":
            return None
        return _active_targets(body.get("data"))

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
    rows = data.get("result")
    return [row for row in rows if _well_formed_row(row)] if isinstance(rows, list) else []


# --------------------------------------------------------------------------------------------------------------------
# the answers' shapes: whatever a proxy, a broken gateway or another product answers, only rows of the documented
# shape (https://prometheus.io/docs/prometheus/latest/querying/api/) go on; the others are dropped here, so the code
# that reads them never meets a list where a dict was promised or a value that is not a number


def _label_set(value: Any) -> bool:
    return isinstance(value, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items())


def _point(value: Any) -> bool:
    """[unix time, "number"]: the time a JSON number, the value a string that reads as a float (NaN and ±Inf too)."""
    if not isinstance(value, list) or len(value) != 2:
        return False
    at, number = value
    if isinstance(at, bool) or not isinstance(at, (int, float)) or not isinstance(number, str):
        return False
    try:
        float(number)
        return math.isfinite(float(at))  # an integer past a float's range (10**400) raises OverflowError
    except (ValueError, OverflowError):
        return False


def _well_formed_row(row: Any) -> bool:
    if not isinstance(row, dict) or not _label_set(row.get("metric")):
        return False
    if "values" in row:
        values = row["values"]
        return isinstance(values, list) and all(_point(v) for v in values)
    return _point(row.get("value"))


def _label_sets(data: Any) -> list[dict[str, str]]:
    """/api/v1/series' rows: label sets that name their metric (every series has a ``__name__``)."""
    if not isinstance(data, list):
        return []
    return [labels for labels in data if _label_set(labels) and "__name__" in labels]


def _active_targets(data: Any) -> list[dict]:
    """/api/v1/targets' active targets that have label sets and a scrape interval that is a string."""
    targets = data.get("activeTargets") if isinstance(data, dict) else None
    if not isinstance(targets, list):
        return []
    return [
        t
        for t in targets
        if isinstance(t, dict) and _label_set(t.get("labels", {})) and isinstance(t.get("scrapeInterval", ""), str)
    ]
