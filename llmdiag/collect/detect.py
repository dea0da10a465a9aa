"""Which inference server is this? Worked out from what it answers, table-driven by the probe specs.

Every probe spec with ``role = "server"`` is a candidate. The evidence, strongest first:

    metric prefixes   the Prometheus page (``prometheus_path`` or ``metrics_path`` of each candidate; the user's
                      --metrics-url when given) has sample names starting with the spec's ``detect_prefixes``:
                      the server with the most such names wins
    headers           a response header holds the spec's ``detect_headers`` text (llama.cpp's ``Server: llama.cpp``)
    JSON endpoints    the spec's ``detect_json``: GET path answers a JSON object (or a list of them) with that key
                      (TGI's /info ``router``, llama.cpp's /props ``total_slots``, SGLang's /get_model_info)
    /v1/models        ``owned_by`` is one of the spec's ``detect_owned_by`` (vllm, sglang, llamacpp)

``detect_live`` returns a ``Detection``: the probe name, the reason in words, and the ``/version`` it saw. A server
that matches nothing raises ``UnsupportedServerError`` with what was seen (first metric names, content type,
headers), so the user can tell a wrong URL from an unsupported server. ``detect_scrape`` does the prefix part for
saved dumps. Adding a server is data only: a probe spec with ``role = "server"`` and its detection fields.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cache

from llmdiag.client.deadline import current, deadline_session
from llmdiag.client.endpoint import Connection, redact_url
from llmdiag.collect.exposition import Scrape, parse_exposition
from llmdiag.collect.http import HttpMetricsSource, get_small
from llmdiag.collect.tape import taped_json
from llmdiag.errors import (
    ConnectError,
    HTTPStatusError,
    NotMetricsError,
    ProbeError,
    ProbeTimeout,
    UnsupportedServerError,
    UsageError,
    option,
)
from llmdiag.schema.loader import load_probe, probe_names
from llmdiag.schema.probes import ProbeSpec

PROBE_TIMEOUT_SECONDS = 3.0
MAX_JSON_BYTES = 1024 * 1024
SEEN_NAMES = 5


@cache
def server_probes() -> tuple[ProbeSpec, ...]:
    """Every probe spec of an inference server, in file-name order. A broken spec raises its RuleSpecError: it
    must not drop silently out of detection."""
    return tuple(spec for spec in map(load_probe, probe_names()) if spec.role == "server")


def server_names() -> list[str]:
    return [s.name for s in server_probes()]


def check_server_name(name: str) -> str:
    """--server NAME: a known server probe, or a usage error listing them."""
    known = server_names()
    if name.lower() not in known:
        raise UsageError(f"{option('server')} {name}: unknown server", f"choose one of {', '.join(known)}")
    return name.lower()


@dataclass
class Detection:
    probe: str
    reason: str
    version: str = ""
    seen: list[str] = field(default_factory=list)

    def describe(self) -> str:
        spec = load_probe(self.probe)
        version = f" {self.version}" if self.version else ""
        return f"{spec.server}{version}: {self.reason}"


def prefix_counts(scrape: Scrape) -> dict[str, int]:
    """How many sample names each server's prefixes claim on one page."""
    names = scrape.names()
    counts: dict[str, int] = {}
    for spec in server_probes():
        hits = sum(1 for n in names if n.startswith(tuple(spec.detect_prefixes)))
        if hits:
            counts[spec.name] = hits
    return counts


def _by_prefix(scrape: Scrape, where: str) -> Detection | None:
    counts = prefix_counts(scrape)
    if not counts:
        return None
    best = max(counts, key=lambda name: counts[name])
    spec = load_probe(best)
    prefixes = "/".join(f"'{p}'" for p in spec.detect_prefixes)
    return Detection(best, f"{counts[best]} metric names on {where} start with {prefixes}")


def detect_scrape(scrape: Scrape, where: str) -> Detection:
    """The server of a saved page, from its metric prefixes; unrecognised → UnsupportedServerError."""
    found = _by_prefix(scrape, where)
    if found is not None:
        return found
    raise unsupported(where, [f"metric names {_first_names(scrape)}"])


def _first_names(scrape: Scrape) -> str:
    names = sorted(scrape.names())
    return ", ".join(names[:SEEN_NAMES]) + (" …" if len(names) > SEEN_NAMES else "") if names else "(none)"


def unsupported(where: str, seen: list[str]) -> UnsupportedServerError:
    servers = ", ".join(s.server for s in server_probes())
    error = UnsupportedServerError(f"unsupported or unrecognised server at {where}: saw {'; '.join(seen)}")
    error.hint = UnsupportedServerError.hint.format(servers=servers)
    return error


class _Looker:
    """GETs against one server with the scan's connection settings; remembers every answer's headers."""

    def __init__(self, connection: Connection) -> None:
        self.connection = connection
        self.session = deadline_session()
        self.session.headers.update({"User-Agent": "llmdiag"})
        self.session.headers.update(connection.headers)
        if connection.api_key:
            self.session.headers["Authorization"] = f"Bearer {connection.api_key}"
        self.session.verify = not connection.insecure
        self.headers: list[tuple[str, str, str]] = []  # (path, header name, value)
        self.timeout = min(connection.timeout_seconds, PROBE_TIMEOUT_SECONDS)

    @taped_json  # recorded into a bundle, or replayed from one (llmdiag.collect.tape)
    def get_json(self, path: str) -> object | None:
        """The JSON answer of GET ``path``, or None (no answer, not 200, not JSON, too large, past the deadline)."""
        deadline = current()
        if deadline is not None and deadline.expired():
            return None
        try:
            answer = get_small(self.session, f"{self.connection.base_url}{path}", self.timeout, MAX_JSON_BYTES)
        except ProbeError:
            return None
        self.headers += [(path, k.lower(), v) for k, v in answer.headers.items()]
        if answer.status != 200 or answer.too_large:
            return None
        try:
            return json.loads(answer.body)
        except ValueError:
            return None

    def close(self) -> None:
        self.session.close()


def _json_has(body: object, key: str, contains: str) -> bool:
    items = body if isinstance(body, list) else [body]
    for item in items[:1]:
        if isinstance(item, dict) and key in item:
            return not contains or contains.lower() in str(item[key]).lower()
    return False


def detect_live(connection: Connection) -> Detection:
    """Work out which server answers at ``connection``: see the module docstring for the evidence and its order."""
    seen: list[str] = []
    failures: list[ProbeError] = []  # no answer at all, or credentials refused: said as they are, not as "unknown"
    looker = _Looker(connection)
    try:
        pages: dict[str, str] = {}  # URL → display
        if connection.metrics_url:
            pages[connection.metrics_url] = redact_url(connection.metrics_url)
        else:
            for spec in server_probes():
                url = f"{connection.base_url}{getattr(spec, 'prometheus_path', '') or spec.metrics_path}"
                pages.setdefault(url, redact_url(url))
        for url, display in pages.items():
            source = HttpMetricsSource(
                Connection(
                    base_url=connection.base_url,
                    metrics_url=url,
                    headers=connection.headers,
                    api_key=connection.api_key,
                    timeout_seconds=connection.timeout_seconds,
                    insecure=connection.insecure,
                    max_metrics_bytes=connection.max_metrics_bytes,
                )
            )
            try:
                text, at = source.fetch_text()
            except ProbeError as exc:
                seen.append(f"{display}: {exc.message}")
                failures.append(exc)
                continue
            finally:
                source.close()
            try:
                scrape = parse_exposition(text, at, origin=display)
            except ProbeError as exc:
                seen.append(f"{display}: {exc.message}")
                continue
            found = _by_prefix(scrape, display)
            if found is not None:
                found.version = _version(looker)
                return found
            seen.append(f"{display}: metric names {_first_names(scrape)}")
        found = _by_other_evidence(looker)
        if found is not None:
            found.version = found.version or _version(looker)
            return found
        unreachable = [e for e in failures if isinstance(e, (ConnectError, ProbeTimeout))]
        if unreachable and len(unreachable) == len(pages) and not looker.headers:
            raise unreachable[0]
        refused = [e for e in failures if isinstance(e, HTTPStatusError) and e.status in (401, 403)]
        if refused:
            raise refused[0]
        server_headers = sorted({f"{name}: {value}" for _, name, value in looker.headers if name == "server"})
        if server_headers:
            seen.append(f"header {', '.join(server_headers)}")
        raise unsupported(redact_url(connection.base_url), seen or ["no answer"])
    finally:
        looker.close()


def _by_other_evidence(looker: _Looker) -> Detection | None:
    specs = server_probes()
    models = looker.get_json("/v1/models")
    owned = set()
    if isinstance(models, dict) and isinstance(models.get("data"), list):
        owned = {str(m.get("owned_by", "")).lower() for m in models["data"] if isinstance(m, dict)}
    for spec in specs:  # headers: already collected by the pages and /v1/models
        for header, text in spec.detect_headers.items():
            for path, name, value in looker.headers:
                if name == header.lower() and text.lower() in value.lower():
                    return Detection(spec.name, f"{path} answered with header '{name}: {value}'")
    for spec in specs:
        for probe in spec.detect_json:
            body = looker.get_json(probe.path)
            if body is not None and _json_has(body, probe.key, probe.contains):
                return Detection(
                    spec.name,
                    f"{probe.path} answered JSON with '{probe.key}'"
                    + (f" = {probe.contains!r}" if probe.contains else ""),
                )
    for spec in specs:
        hit = owned & {o.lower() for o in spec.detect_owned_by}
        if hit:
            return Detection(spec.name, f"/v1/models says owned_by '{sorted(hit)[0]}'")
    return None


def _version(looker: _Looker) -> str:
    body = looker.get_json("/version")
    if isinstance(body, dict) and isinstance(body.get("version"), str):
        return body["version"]
    return ""


def note_server_choice(signals, probe: str, reason: str) -> None:
    """Say in the server's coverage line which server was picked and why."""
    for source in signals.sources:
        if source.probe == probe:
            source.note = f"server: {reason}" + (f"; {source.note}" if source.note else "")
            return


def detect_files(scrapes: list[Scrape], where: str) -> Detection:
    """The server of saved dumps: TensorRT-LLM's JSON records, else the metric prefixes of the first dump."""
    if any(getattr(s, "records", None) is not None for s in scrapes):
        return Detection("trtllm", f"{where} holds TensorRT-LLM's JSON iteration statistics")
    return detect_scrape(scrapes[0], where)


def detect_for_scan(connection: Connection, clock) -> tuple[str, str, Scrape | None, float | None]:
    """A scan's first read of the page, which also says which server it is: (probe, reason, scrape, read at).

    The page at --metrics-url (or URL/metrics) is read once; when its metric prefixes name a server, that read is
    the window's first scrape, so detection costs no extra request. Otherwise the other evidence is asked for
    (``detect_live``), and the scrape is not reused. A page that cannot be read at all fails as a scan's first
    scrape does, unless the other evidence names the server (SGLang without --enable-metrics answers 404)."""
    page = HttpMetricsSource(connection, "/metrics")
    at = clock()
    first_error: ProbeError | None = None
    try:
        scrape = page.scrape()
    except (NotMetricsError, HTTPStatusError) as exc:
        scrape, first_error = None, exc
    finally:
        page.close()
    if scrape is not None:
        found = _by_prefix(scrape, page.display_url)
        if found is not None:
            return found.probe, f"detected {found.describe()}", scrape, at
    try:
        found = detect_live(connection)
    except UnsupportedServerError as error:
        if isinstance(first_error, HTTPStatusError):
            raise first_error from None
        if first_error is not None and first_error.hint and first_error.hint != NotMetricsError.hint:
            error.hint = first_error.hint  # the page's own diagnosis (e.g. TensorRT-LLM's JSON) says more
        raise
    return found.probe, f"detected {found.describe()}", None, None
