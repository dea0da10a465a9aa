"""An async client for the OpenAI-compatible API, measured from the client side (OpenAIClient; see llmdiag.client),
and its settings apart from the URL (ClientOptions), for code that opens the client later."""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import secrets
import socket
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote, urlsplit

from llmdiag.client.endpoint import Connection, normalise_base_url, redact_url
from llmdiag.client.http1 import _STALE, READ_BUFFER_BYTES, _connect_failure, _Connection, _header_line
from llmdiag.client.result import RequestPlan, RequestResult, _monotonic
from llmdiag.client.rxtime import StampingSocket
from llmdiag.errors import ConnectError, HTTPStatusError, ProbeError, ProbeTimeout, UsageError

DEFAULT_TIMEOUT_SECONDS = 60.0
# where each server tells its version, in order: (path, key of the JSON object)
VERSION_PAGES = (
    ("/version", "version"),
    ("/info", "version"),
    ("/get_server_info", "version"),
    ("/props", "build_info"),
)


class OpenAIClient:
    """An async client for one OpenAI-compatible server (vLLM, SGLang, TGI, llama.cpp, OpenAI ...).

        async with OpenAIClient("http://127.0.0.1:8000", model="m") as client:
            result = await client.complete("Hello", 64)

    ``base_url`` may end in /v1 or not. ``model=None`` takes the first model of /v1/models (once).
    ``timeout_seconds`` bounds every wait for bytes: connecting, the answer's first byte and each gap mid-stream
    (not the whole answer, which can rightly take minutes). ``insecure`` skips TLS verification.
    ``max_connections`` caps the requests in flight, and so the open connections (0: no cap).
    """

    def __init__(
        self,
        base_url: str,
        *,
        model: str | None = None,
        api_key: str | None = None,
        headers: Mapping[str, str] | None = None,
        timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS,
        insecure: bool = False,
        max_connections: int = 0,
    ) -> None:
        if timeout_seconds <= 0:
            raise UsageError(f"timeout_seconds must be positive, got {timeout_seconds:g}")
        if max_connections < 0:
            raise UsageError(f"max_connections must be 0 (no cap) or more, got {max_connections}")
        self.base_url = normalise_base_url(base_url)
        self.display_url = redact_url(self.base_url)
        parts = urlsplit(self.base_url)
        self.host = parts.hostname or ""
        self.tls = parts.scheme == "https"
        self.port = parts.port or (443 if self.tls else 80)
        prefix = parts.path.rstrip("/")
        self._prefix = prefix[:-3] if prefix.endswith("/v1") else prefix
        self.model = model
        self.timeout_seconds = timeout_seconds
        self.max_connections = max_connections
        host_header = f"[{self.host}]" if ":" in self.host else self.host
        if parts.port is not None:
            host_header += f":{parts.port}"
        lines = [
            _header_line("Host", host_header),
            b"User-Agent: llmdiag\r\nAccept-Encoding: identity\r\nContent-Type: application/json\r\n",
        ]
        for name, value in (headers or {}).items():
            if name.lower() not in ("host", "content-length", "transfer-encoding"):
                lines.append(_header_line(name, value))
        if api_key:
            lines.append(_header_line("Authorization", f"Bearer {api_key}"))
        elif parts.username is not None and not any(n.lower() == "authorization" for n in headers or {}):
            basic = f"{unquote(parts.username)}:{unquote(parts.password or '')}".encode()
            lines.append(_header_line("Authorization", f"Basic {base64.b64encode(basic).decode()}"))
        self._headers = b"".join(lines)  # the secrets live here and nowhere else
        self._ssl: ssl.SSLContext | None = None
        if self.tls:
            self._ssl = ssl.create_default_context()
            if insecure:
                self._ssl.check_hostname = False
                self._ssl.verify_mode = ssl.CERT_NONE
        self._idle: list[_Connection] = []
        self._read_buffer = bytearray(READ_BUFFER_BYTES)  # one for all connections: see _Connection
        self._slots = asyncio.Semaphore(max_connections) if max_connections else None
        self._id_prefix = secrets.token_hex(4)
        self._ids = itertools.count(1)
        self._model_checked = model is not None
        self._model_lookup: asyncio.Future[None] | None = None

    def __repr__(self) -> str:
        return f"OpenAIClient({self.display_url!r}, model={self.model!r})"

    @classmethod
    def from_connection(cls, connection: Connection, **kwargs: Any) -> OpenAIClient:
        """A client with a scan's Connection (its URL, headers, API key and TLS choice)."""
        kwargs.setdefault("headers", connection.headers)
        kwargs.setdefault("api_key", connection.api_key)
        kwargs.setdefault("insecure", connection.insecure)
        return cls(connection.base_url, **kwargs)

    async def __aenter__(self) -> OpenAIClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the kept-alive connections (those in flight belong to their requests)."""
        idle, self._idle = self._idle, []
        for connection in idle:
            connection.abort()  # no TLS close_notify exchange: nothing is left to say on an idle connection
        if idle:
            await asyncio.sleep(0)  # the transports close on the loop's next turn

    # requests

    def new_result(self, request_id: str | None = None) -> RequestResult:
        """A result to fill; its id goes to the server as X-Request-Id (unique per client unless given)."""
        if request_id is not None and (not request_id.isprintable() or not request_id.isascii()):
            raise UsageError(f"request ids are printable ASCII (they go in a header), got {request_id!r}")
        return RequestResult(request_id or f"llmdiag-{self._id_prefix}-{next(self._ids)}", _monotonic())

    async def complete(
        self,
        prompt: str | list[int],
        max_tokens: int,
        *,
        chat: bool = False,
        stream: bool = True,
        ignore_eos: bool = True,
        min_tokens: int | None = None,
        request_id: str | None = None,
    ) -> RequestResult:
        """Send one completion and read the whole answer. Failures are in the result, never raised (bad arguments
        raise UsageError). ``ignore_eos`` and ``min_tokens`` are vLLM's extensions: they make the output as long as
        asked; servers that do not know them may refuse them (HTTP 400, in the result)."""
        plan = RequestPlan(prompt, max_tokens, chat, stream, ignore_eos, min_tokens, request_id)
        result = self.new_result(request_id)
        await self.execute(plan, result)
        return result

    async def execute(self, plan: RequestPlan, result: RequestResult) -> None:
        """Send ``plan`` and fill ``result`` in place. Cancelled, it records the result as "cancelled" (with what
        had arrived) and re-raises, so a runner that cancels keeps the result it created."""
        if not self._model_checked:
            try:
                await self._default_model()
            except asyncio.CancelledError:  # still waiting for the model's name: sent nothing, finished nothing
                _cancelled(result)
                raise
        path, body = self._completion(plan)
        request = b"POST %s HTTP/1.1\r\n%sAccept: %s\r\nContent-Length: %d\r\nX-Request-Id: %s\r\n\r\n%s" % (
            path,
            self._headers,
            b"text/event-stream" if plan.stream else b"application/json",
            len(body),
            result.request_id.encode(),
            body,
        )
        await self._exchange(request, result, plan.chat)

    def _completion(self, plan: RequestPlan) -> tuple[bytes, bytes]:
        if isinstance(plan.max_tokens, bool) or not isinstance(plan.max_tokens, int) or plan.max_tokens < 1:
            raise UsageError(f"max_tokens must be a positive integer, got {plan.max_tokens!r}")
        body: dict[str, Any] = {"model": self.model} if self.model else {}
        if plan.chat:
            if not isinstance(plan.prompt, str):
                raise UsageError("a chat request takes a text prompt, not token ids")
            body["messages"] = [{"role": "user", "content": plan.prompt}]
        else:
            body["prompt"] = plan.prompt
        body["max_tokens"] = plan.max_tokens
        if plan.stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        if plan.ignore_eos:
            body["ignore_eos"] = True
        if plan.min_tokens is not None:
            body["min_tokens"] = plan.min_tokens
        if plan.extra_body:
            body.update(plan.extra_body)
        path = f"{self._prefix}/v1/chat/completions" if plan.chat else f"{self._prefix}/v1/completions"
        return path.encode(), json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()

    async def _exchange(self, request: bytes, result: RequestResult, chat: bool, completion: bool = True) -> bytes:
        """Send ``request`` on a kept-alive or new connection and read the answer into ``result``; returns the
        answer's body when it was not an event stream."""
        slots = self._slots
        if slots is not None:
            await slots.acquire()
        connection: _Connection | None = None
        try:
            for _attempt in range(2):
                connection = await self._connection(result)
                if connection is None:
                    return b""
                outcome = await connection.begin(result, request, chat, completion)
                if outcome is not _STALE:
                    break
                connection = None  # a stale keep-alive connection: once more on a fresh one
            if connection is None:
                return b""
            if connection.reusable:
                self._idle.append(connection)
            return connection.body
        except asyncio.CancelledError:
            if connection is not None:
                connection.abandon("cancelled", "cancelled before the answer ended")
                # an answer that had ended as the cancel came: its connection is idle but in no pool that closes it
                connection.abort()
            _cancelled(result)
            raise
        finally:
            if slots is not None:
                slots.release()

    async def _connection(self, result: RequestResult) -> _Connection | None:
        """A kept-alive connection, or a new one; None with the failure in ``result``."""
        while self._idle:
            connection = self._idle.pop()
            if connection.reusable:
                return connection
        loop = asyncio.get_running_loop()
        connection = _Connection(loop, self.timeout_seconds, self._read_buffer)
        where = f"{self.host}:{self.port}"
        try:
            await asyncio.wait_for(self._connect(loop, connection), self.timeout_seconds)
        except asyncio.TimeoutError:
            result.ended_at = _monotonic()
            result.error_kind = "timeout"
            result.error = f"connecting to {where} took longer than {self.timeout_seconds:g} s"
            return None
        except (OSError, ssl.SSLError) as exc:
            result.ended_at = _monotonic()
            result.error_kind, result.error = "connect", _connect_failure(exc, where)
            await asyncio.sleep(0)  # asyncio closes a transport whose TLS handshake failed on the next turn
            return None
        return connection

    async def _connect(self, loop: asyncio.AbstractEventLoop, connection: _Connection) -> None:
        """Connect ``connection`` on a socket of our own: one whose reads carry the kernel's arrival stamps."""
        addresses = await loop.getaddrinfo(self.host, self.port, type=socket.SOCK_STREAM)
        failure: OSError | None = None
        for family, kind, proto, _name, address in addresses:
            sock = StampingSocket(family, kind, proto)
            try:
                sock.setblocking(False)
                sock.enable_stamps()
                await loop.sock_connect(sock, address)
                connection.rx = sock
                await loop.create_connection(
                    lambda: connection, sock=sock, ssl=self._ssl, server_hostname=self.host if self._ssl else None
                )
                return
            except OSError as exc:
                sock.close()
                failure = exc
            except BaseException:
                sock.close()
                raise
        raise failure or OSError(f"{self.host} resolves to no address")

    async def request_json(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        """One small JSON request (GET /v1/models, POST /tokenize): (status, parsed body or None), the whole answer
        within ``timeout_seconds``. Raises ConnectError, ProbeTimeout or ProbeError when no HTTP answer came."""
        payload = b"" if body is None else json.dumps(body, separators=(",", ":")).encode()
        request = b"%s %s%s HTTP/1.1\r\n%sAccept: application/json\r\nContent-Length: %d\r\n\r\n%s" % (
            method.encode(),
            self._prefix.encode(),
            path.encode(),
            self._headers,
            len(payload),
            payload,
        )
        result = self.new_result()
        url = f"{self.display_url}{path}"
        try:  # a small answer comes whole within the timeout: a server dripping it cannot hold the caller
            answer = await asyncio.wait_for(
                self._exchange(request, result, chat=False, completion=False), self.timeout_seconds
            )
        except asyncio.TimeoutError:
            raise ProbeTimeout(f"{url} did not send its whole answer within {self.timeout_seconds:g} s") from None
        if result.error_kind == "connect":
            raise ConnectError(result.error or f"cannot connect to {url}")
        if result.error_kind == "timeout":
            raise ProbeTimeout(f"{url}: {result.error}")
        if result.status is None:
            raise ProbeError(f"{url}: {result.error}")
        try:
            parsed = json.loads(answer) if answer else None
        except ValueError:
            parsed = None
        return result.status, parsed

    async def models(self) -> list[str]:
        """The served model names (GET /v1/models)."""
        status, body = await self.request_json("GET", "/v1/models")
        if status != 200:
            raise HTTPStatusError(f"{self.display_url}/v1/models", status)
        data = body.get("data") if isinstance(body, dict) else None
        if not isinstance(data, list):
            raise ProbeError(f"{self.display_url}/v1/models did not list models", "is this an OpenAI-compatible API?")
        return [m["id"] for m in data if isinstance(m, dict) and isinstance(m.get("id"), str)]

    async def server_version(self) -> tuple[str | None, str]:
        """The server's own version and where it was read: (None, why) when no page tells it. vLLM and
        TensorRT-LLM answer GET /version, TGI /info and SGLang /get_server_info with a ``version``; llama.cpp's
        /props has ``build_info``."""
        for path, key in VERSION_PAGES:
            try:
                status, body = await self.request_json("GET", path)
            except ProbeError:
                continue
            if status == 200 and isinstance(body, dict) and isinstance(body.get(key), str) and body[key]:
                return body[key], f"GET {path} '{key}'"
        pages = ", ".join(path for path, _ in VERSION_PAGES)
        return None, f"none of {pages} told a version"

    async def count_tokens(self, text: str) -> int | None:
        """The server's token count for ``text`` (vLLM's POST /tokenize); None when it has no such endpoint or it
        fails."""
        body: dict[str, Any] = {"prompt": text}
        if self.model:
            body["model"] = self.model
        try:
            status, parsed = await self.request_json("POST", "/tokenize", body)
        except ProbeError:
            return None
        if status != 200 or not isinstance(parsed, dict):
            return None
        count = parsed.get("count")
        if isinstance(count, int) and not isinstance(count, bool):
            return count
        tokens = parsed.get("tokens")
        return len(tokens) if isinstance(tokens, list) else None

    async def _default_model(self) -> None:
        """Look the model up once; requests that start meanwhile wait for the same lookup."""
        if self._model_lookup is None:
            self._model_lookup = asyncio.ensure_future(self._look_up_model())
        await asyncio.shield(self._model_lookup)

    async def _look_up_model(self) -> None:
        try:
            names = await self.models()
        except ProbeError:
            names = []  # send no model; the server may have a default
        if names and self.model is None:
            self.model = names[0]
        self._model_checked = True


def _cancelled(result: RequestResult) -> None:
    """A request cancelled before its answer ended (connecting, waiting for a slot or for the model's name)."""
    if result.ended_at == 0.0:
        result.ended_at = _monotonic()
        result.error_kind, result.error = "cancelled", "cancelled before the answer ended"


@dataclass(frozen=True)
class ClientOptions:
    """How an OpenAIClient talks to its server, all but the URL (``OpenAIClient``'s keyword arguments), for code that
    opens its client later (``BackgroundLoad``). The key and the headers stay out of the repr."""

    model: str | None = None
    api_key: str | None = field(default=None, repr=False)
    headers: Mapping[str, str] | None = field(default=None, repr=False)
    timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS
    insecure: bool = False
    max_connections: int = 0

    def open(self, base_url: str) -> OpenAIClient:
        return OpenAIClient(
            base_url,
            model=self.model,
            api_key=self.api_key,
            headers=self.headers,
            timeout_seconds=self.timeout_seconds,
            insecure=self.insecure,
            max_connections=self.max_connections,
        )
