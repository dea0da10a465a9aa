"""The client side of "what users actually get": llmdiag.client over real HTTP on 127.0.0.1.

Two kinds of server: the simulator (a vLLM on the wire) for the API, the runners and prompt lengths; and a raw
scripted TCP server that sends exactly the bytes a test gives it, for broken streams, error answers and stalls.
The tests assert structure and classes, never absolute times (two noisy cores).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from llmdiag.client.openai import OpenAIClient
from llmdiag.client.prompts import PromptFactory
from llmdiag.client.result import RequestPlan, RequestResult
from llmdiag.client.runners import (
    BackgroundLoad,
    LoadShape,
    check_target,
    closed_loop,
    is_loopback,
    open_loop,
    raise_open_files_limit,
)
from llmdiag.errors import UsageError
from llmdiag.sim.app import SimConfig
from llmdiag.sim.engine import EngineConfig
from llmdiag.sim.openai import WORDS
from llmdiag.sim.presets import get_preset
from llmdiag.sim.server import SimServer

pytestmark = pytest.mark.timeout(120)

CLOSE = object()  # a script step: close the connection now


@pytest.fixture(scope="module")
def sim():
    with SimServer("healthy", record_timings=True) as server:
        yield server


def run(coro):
    return asyncio.run(coro)


async def one(url: str, *args, client_options: dict | None = None, **kwargs) -> RequestResult:
    async with OpenAIClient(url, **(client_options or {})) as client:
        return await client.complete(*args, **kwargs)


def sim_text(tokens: int) -> str:
    return "".join(" " + WORDS[i % len(WORDS)] for i in range(tokens))


# --- a raw scripted HTTP server --------------------------------------------------------------------------------


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    connection: int  # which TCP connection carried it (1, 2, ...)


Script = Callable[[Seen], list]  # steps: bytes to send, a float to sleep, CLOSE


@dataclass
class RawServer:
    """Answers each request with the steps ``script(request)`` returns; keeps the connection open for the next
    request unless a step closes it. Records every request."""

    script: Script
    seen: list[Seen] = field(default_factory=list)
    connections: int = 0
    tls: ssl.SSLContext | None = None  # serve HTTPS with this context

    def __post_init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.url = f"{'https' if self.tls else 'http'}://127.0.0.1:{self.sock.getsockname()[1]}"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)

    def __enter__(self) -> RawServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self.sock.close()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._serve, args=(conn, self.connections), daemon=True).start()

    def _serve(self, conn: socket.socket, number: int) -> None:
        buffer = b""
        if self.tls is not None:
            try:
                conn = self.tls.wrap_socket(conn, server_side=True)
            except (OSError, ssl.SSLError):
                conn.close()  # a client that refused the certificate
                return
        with conn:
            while True:
                while b"\r\n\r\n" not in buffer:
                    try:
                        data = conn.recv(65536)
                    except OSError:
                        return
                    if not data:
                        return
                    buffer += data
                head, _, buffer = buffer.partition(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
                length = int(headers.get("content-length", "0"))
                while len(buffer) < length:
                    buffer += conn.recv(65536)
                body, buffer = buffer[:length], buffer[length:]
                request = Seen(method, path, headers, body, number)
                self.seen.append(request)
                try:
                    for step in self.script(request):
                        if step is CLOSE:
                            return
                        if isinstance(step, float):
                            time.sleep(step)
                        else:
                            conn.sendall(step)
                except OSError:
                    return


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


SSE_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
END = b"0\r\n\r\n"


def text_event(text: str, finish: str | None = None) -> bytes:
    choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
    body = {"id": "cmpl-1", "object": "text_completion", "model": "m", "choices": [choice], "usage": None}
    return b"data: " + json.dumps(body, separators=(",", ":")).encode() + b"\n\n"


def usage_event(prompt: int, completion: int) -> bytes:
    usage = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
    return b"data: " + json.dumps({"id": "cmpl-1", "choices": [], "usage": usage}).encode() + b"\n\n"


DONE = b"data: [DONE]\n\n"


def json_reply(status: int, body: object, extra_headers: str = "") -> bytes:
    raw = json.dumps(body).encode()
    return (
        f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {len(raw)}\r\n{extra_headers}\r\n"
    ).encode() + raw


def sse_script(*events: bytes, tail: list | None = None) -> Script:
    """A chunked SSE answer, one event per chunk; ``tail`` replaces the clean end."""
    steps = [SSE_HEAD] + [chunk(e) for e in events]
    return lambda request: steps + (tail if tail is not None else [END])


# --- results -------------------------------------------------------------------------------------------------


def test_result_properties_follow_their_definitions():
    result = RequestResult("r", started_at=10.0, token_times=[10.5, 10.7, 11.0], ended_at=11.5, output_tokens=6)
    result.first_token_at = 10.5
    assert result.ok and result.ttft_seconds == pytest.approx(0.5) and result.e2e_seconds == pytest.approx(1.5)
    assert result.itl_seconds == pytest.approx([0.2, 0.3])
    assert result.tpot_seconds == pytest.approx((11.5 - 10.5) / 5)
    assert result.tokens_per_second == pytest.approx(4.0)
    single = RequestResult("s", started_at=0.0, token_times=[0.1], ended_at=0.2, output_tokens=1, first_token_at=0.1)
    assert single.tpot_seconds is None and single.itl_seconds == []
    failed = RequestResult("f", started_at=0.0, error="HTTP 503: busy", error_kind="http", status=503)
    assert not failed.ok and failed.ttft_seconds is None and failed.tokens_per_second is None


# --- the API against the simulator ----------------------------------------------------------------------------


def check_stream_structure(result: RequestResult) -> None:
    assert result.ok, result.error
    times = result.token_times
    assert times and times == sorted(times)
    assert result.first_token_at == times[0]
    assert result.started_at <= result.first_token_at <= result.ended_at
    assert len(result.itl_seconds) == len(times) - 1 and all(gap >= 0 for gap in result.itl_seconds)
    assert len(times) <= result.output_tokens  # an event carries one token or more


def test_streaming_completion_counts_tokens_from_usage(sim):
    result = run(one(sim.url, "one two three four five", 12))
    check_stream_structure(result)
    assert result.status == 200 and result.error_kind is None
    assert (result.output_tokens, result.output_tokens_from, result.prompt_tokens) == (12, "usage", 5)
    assert result.received_text_chars == len(sim_text(12))
    assert result.tpot_seconds is not None and result.tpot_seconds > 0
    assert result.ttft_seconds is not None and result.ttft_seconds > 0


def test_streaming_chat_does_not_count_the_role_event_as_a_token(sim):
    result = run(one(sim.url, "hello there", 6, chat=True))
    check_stream_structure(result)
    assert (result.output_tokens, result.output_tokens_from, result.prompt_tokens) == (6, "usage", 2)
    assert result.received_text_chars == len(sim_text(6))


@pytest.mark.parametrize("chat", [False, True])
def test_non_streaming_answers_are_read_from_the_body(sim, chat):
    result = run(one(sim.url, "a b c", 7, chat=chat, stream=False))
    assert result.ok, result.error
    assert (result.output_tokens, result.output_tokens_from, result.prompt_tokens) == (7, "body", 3)
    assert result.token_times == [] and result.ttft_seconds is None and result.e2e_seconds > 0
    assert result.received_text_chars == len(sim_text(7))


def test_token_id_prompts_and_request_ids(sim):
    result = run(one(sim.url, [1, 2, 3, 4], 3, request_id="mine-1"))
    assert result.ok and result.prompt_tokens == 4 and result.request_id == "mine-1"


def test_ignore_eos_and_min_tokens_make_the_output_as_long_as_asked():
    config = SimConfig(EngineConfig(get_preset("healthy").deployment), stop_after_tokens=3)
    with SimServer(config) as server:

        async def main():
            async with OpenAIClient(server.url) as client:
                return (
                    await client.complete("x y", 10, ignore_eos=True),
                    await client.complete("x y", 10, ignore_eos=False),
                    await client.complete("x y", 10, ignore_eos=False, min_tokens=6),
                )

        asked, eos, floor = run(main())
    assert [r.output_tokens for r in (asked, eos, floor)] == [10, 3, 6]
    assert all(r.ok and r.output_tokens_from == "usage" for r in (asked, eos, floor))


def test_models_and_the_default_model(sim):
    async def main():
        async with OpenAIClient(sim.url + "/v1") as client:  # a base URL ending in /v1 works too
            names = await client.models()
            result = await client.complete("a", 2)
            return names, client.model, result

    names, model, result = run(main())
    assert names == [sim.model] and model == sim.model and result.ok


def test_the_simulator_tokenizes_like_vllm(sim):
    import requests

    reply = requests.post(sim.url + "/tokenize", json={"model": sim.model, "prompt": "one two three"}, timeout=10)
    body = reply.json()
    assert reply.status_code == 200 and set(body) == {"count", "max_model_len", "tokens", "token_strs"}
    assert body["count"] == 3 == len(body["tokens"]) and body["token_strs"] is None
    chat = requests.post(sim.url + "/tokenize", json={"messages": [{"role": "user", "content": "a b"}]}, timeout=10)
    assert chat.json()["count"] == 2
    assert requests.post(sim.url + "/tokenize", json={"model": "other", "prompt": "a"}, timeout=10).status_code == 404

    async def count():
        async with OpenAIClient(sim.url, model=sim.model) as client:
            return await client.count_tokens("four words right here")

    assert run(count()) == 4


# --- prompts of a chosen length ------------------------------------------------------------------------------


def test_prompts_hit_the_asked_length_with_the_servers_tokenizer(sim):
    async def main():
        async with OpenAIClient(sim.url, model=sim.model) as client:
            factory = PromptFactory(client, seed=7)
            prompt = await factory.prompt(100)
            result = await client.complete(prompt, 2)
            text, counted = await factory.exact_prompt(40)
            return factory, result, text, counted

    factory, result, text, counted = run(main())
    assert factory.calibrated_from == "tokenize" and factory.tokens_per_word == pytest.approx(1.0)
    assert result.prompt_tokens == 100  # the server's own count
    assert counted == 40 and len(text.split()) == 40


def test_prompts_without_a_tokenize_endpoint_use_the_estimate():
    with RawServer(lambda request: [json_reply(404, {"detail": "Not Found"})]) as server:

        async def main():
            async with OpenAIClient(server.url, model="m") as client:
                factory = PromptFactory(client, seed=3)
                return factory, await factory.prompt(64), await factory.prompt(64)

        factory, first, second = run(main())
    assert factory.calibrated_from == "estimate" and len(first.split()) == 64
    assert first != second  # a fresh draw each time: no prefix-cache hits
    assert [r.path for r in server.seen] == ["/tokenize"]  # asked once, not per prompt


def test_prompts_are_deterministic_for_a_seed():
    first = run(PromptFactory(seed=11).prompt(30))
    assert first == run(PromptFactory(seed=11).prompt(30)) != run(PromptFactory(seed=12).prompt(30))


# --- runners -------------------------------------------------------------------------------------------------


def plans(max_tokens: int = 8, chat: bool = False) -> Callable[[], RequestPlan]:
    return lambda: RequestPlan("a b c d", max_tokens, chat=chat)


def test_closed_loop_stops_at_max_requests(sim):
    async def main():
        async with OpenAIClient(sim.url) as client:
            return await closed_loop(client, 4, plans(), duration_seconds=60, max_requests=10)

    started = time.monotonic()
    results = run(main())
    assert len(results) == 10 and all(r.ok for r in results), [r.error for r in results]
    assert time.monotonic() - started < 30  # ended by the count, not the duration
    assert [r.started_at for r in results] == sorted(r.started_at for r in results)
    assert len({r.request_id for r in results}) == 10


def test_closed_loop_cancels_what_is_in_flight_at_the_deadline(sim):
    seen: list[RequestResult] = []

    async def main():
        async with OpenAIClient(sim.url) as client:  # long answers: some are always streaming at the deadline
            return await closed_loop(
                client, 3, plans(max_tokens=2000), duration_seconds=1.0, max_requests=None, on_result=seen.append
            )

    started = time.monotonic()
    results = run(main())
    assert time.monotonic() - started < 10
    cancelled = [r for r in results if r.error_kind == "cancelled"]
    assert len(cancelled) == 3 and not [r for r in results if r.error_kind not in (None, "cancelled")]
    assert all(r.token_times for r in cancelled)  # what arrived before the deadline is kept
    assert all(r.output_tokens == len(r.token_times) and r.output_tokens_from == "chunks" for r in cancelled)
    assert sorted(id(r) for r in seen) == sorted(id(r) for r in results)  # every result reached the callback


def test_closed_loop_think_time_spaces_a_users_requests(sim):
    async def main():
        async with OpenAIClient(sim.url) as client:
            return await closed_loop(
                client, 1, plans(2), duration_seconds=1.0, max_requests=None, think_time_seconds=0.4
            )

    results = run(main())
    assert 1 <= len(results) <= 3
    gaps = [b.started_at - a.ended_at for a, b in zip(results, results[1:], strict=False)]
    assert all(gap >= 0.35 for gap in gaps)


def test_open_loop_is_bounded_by_count_and_by_duration(sim):
    async def main():
        async with OpenAIClient(sim.url) as client:
            counted = await open_loop(client, 200.0, plans(), duration_seconds=30, max_requests=5, seed=1)
            timed = await open_loop(client, 20.0, plans(), duration_seconds=1.0, max_requests=None, seed=2)
            return counted, timed

    counted, timed = run(main())
    assert len(counted) == 5 and all(r.ok for r in counted)
    assert 1 <= len(timed) <= 80  # Poisson(20 over 1 s): far inside these bounds
    assert {r.error_kind for r in timed} <= {None, "cancelled"}


def test_runners_refuse_a_remote_server_unless_allowed():
    assert is_loopback("http://127.0.0.1:8000") and is_loopback("localhost:1") and is_loopback("http://[::1]:80")
    assert is_loopback("http://127.0.0.2:9") and not is_loopback("http://10.0.0.5:8000")
    assert not is_loopback("https://api.example.com")
    with pytest.raises(UsageError) as refused:
        check_target("http://user:secret@10.0.0.5:8000", allow_remote=False)
    assert "pass allow_remote" in refused.value.hint and "secret" not in refused.value.message
    check_target("http://10.0.0.5:8000", allow_remote=True)

    async def main(**kwargs):
        async with OpenAIClient("http://10.0.0.5:8000", model="m") as client:
            return await closed_loop(client, 1, plans(), duration_seconds=1, max_requests=0, **kwargs)

    with pytest.raises(UsageError):
        run(main())
    assert run(main(allow_remote=True)) == []  # allowed; zero requests asked, none sent
    with pytest.raises(UsageError):
        BackgroundLoad("http://10.0.0.5:8000", plans(), LoadShape(1, users=1))


def test_open_files_limit_is_raised_for_many_users():
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(256, hard), hard))
        assert raise_open_files_limit(1064) == min(1064, hard)
        assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] == min(1064, hard)
        assert raise_open_files_limit(100) == min(1064, hard)  # never lowered
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_background_load_counts_and_stops(sim):
    with BackgroundLoad(sim.url, plans(64), LoadShape(60, users=4), keep_results=True) as load:
        deadline = time.monotonic() + 20
        while load.tally.ok < 4 and time.monotonic() < deadline:
            time.sleep(0.05)
    assert not load.running and load.error is None
    tally = load.tally
    assert tally.ok >= 4 and not tally.errors and tally.completion_tokens == 64 * tally.ok
    assert tally.cancelled == 4  # the four users were mid-answer when the block ended
    assert len(load.results) == tally.ok + tally.cancelled
    assert tally.started >= tally.ok + tally.cancelled


def test_background_open_loop_ends_by_itself_and_reports_a_broken_factory(sim):
    load = BackgroundLoad(sim.url, plans(), LoadShape(30, rate_per_second=50, max_requests=6)).start()
    assert load.wait(20) and load.tally.ok == 6 and load.error is None

    def broken() -> RequestPlan:
        raise KeyError("no such prompt")

    failing = BackgroundLoad(sim.url, broken, LoadShape(5, users=2)).start()
    assert failing.wait(10) and isinstance(failing.error, KeyError)


def test_closed_loop_load_is_the_simulators_preset_driver(sim):
    from llmdiag.sim.load import ClosedLoopLoad
    from llmdiag.sim.presets import LoadSpec

    with ClosedLoopLoad(sim.url, sim.model, LoadSpec(2, 8, 4), max_seconds=30, max_requests=5) as load:
        assert load.wait(20)
    assert load.tally.ok == 5 and load.tally.completion_tokens == 20 and load.tally.started == 5
    assert len(load.tally.ttft_seconds) == 5 and not load.tally.errors


# --- server-side timings (the simulator) ---------------------------------------------------------------------


def test_client_timestamps_follow_the_servers_own(sim):
    sim.timings(clear=True)
    result = run(one(sim.url, "a b c", 20, request_id="timed-1"))
    untimed = run(one(sim.url, "a b c", 2))  # its generated id is recorded too, under that id
    record = sim.timings()["requests"]["timed-1"]
    assert result.ok and untimed.request_id in sim.timings()["requests"]
    assert record["status"] == 200 and sum(record["event_tokens"]) == 20
    assert len(record["event_times"]) == len(result.token_times)
    # one clock for both processes: the server writes before the client reads, and receives after it sends
    assert result.started_at <= record["received_at"] <= record["event_times"][0] <= result.first_token_at
    assert all(s <= c for s, c in zip(record["event_times"], result.token_times, strict=True))
    assert record["ended_at"] >= record["event_times"][-1]


def test_timings_are_bounded_and_off_by_default():
    import requests

    with SimServer("healthy", record_timings=True, max_timed_requests=2) as server:

        async def main():
            async with OpenAIClient(server.url) as client:
                for i in range(4):
                    await client.complete("a", 1, request_id=f"r{i}")

        run(main())
        page = requests.get(server.url + "/sim/timings", timeout=10).json()
        assert list(page["requests"]) == ["r2", "r3"] and page["dropped"] == 2 and page["clock"] == "time.monotonic"
        assert requests.get(server.url + "/sim/timings?clear=1", timeout=10).json()["requests"]
        assert requests.get(server.url + "/sim/timings", timeout=10).json()["requests"] == {}
    with SimServer("healthy") as plain:
        assert requests.get(plain.url + "/sim/timings", timeout=10).status_code == 404
        with pytest.raises(RuntimeError):
            plain.timings()


# --- broken streams and error answers (the scripted server) -------------------------------------------------


def test_a_connection_dropped_mid_stream_is_a_stream_error_with_what_arrived():
    script = sse_script(text_event(" a"), text_event(" bb"), text_event(" ccc"), tail=[0.05, CLOSE])
    with RawServer(script) as server:
        result = run(one(server.url, "p", 10, client_options={"model": "m"}))
    assert result.error_kind == "stream" and result.status == 200 and not result.ok
    assert "closed the connection mid-answer" in result.error
    assert len(result.token_times) == 3 and result.output_tokens == 3 and result.output_tokens_from == "chunks"
    assert result.received_text_chars == len(" a bb ccc") and result.first_token_at == result.token_times[0]


@pytest.mark.parametrize(
    ("bad", "words"),
    [
        (b"this is not an SSE line\n\n", "malformed SSE line"),
        (b"data: {not json}\n\n", "not JSON"),
        (b'data: {"id": "x", "choi\n\n', "not JSON"),
        (b"data: [1, 2]\n\n", "not a JSON object"),
    ],
)
def test_malformed_sse_is_a_stream_error_with_what_arrived(bad, words):
    script = sse_script(text_event(" a"), text_event(" b"), bad, text_event(" c"), DONE)
    with RawServer(script) as server:
        result = run(one(server.url, "p", 10, client_options={"model": "m"}))
    assert result.error_kind == "stream" and words in result.error, result.error
    assert result.output_tokens == 2 == len(result.token_times)


def test_an_error_event_inside_the_stream_keeps_its_code():
    error = b'data: {"error": {"object": "error", "message": "engine overloaded", "type": "x", "code": 503}}\n\n'
    with RawServer(sse_script(text_event(" a"), error, DONE)) as server:
        result = run(one(server.url, "p", 10, client_options={"model": "m"}))
    assert result.error_kind == "stream" and result.error_code == 503 and "engine overloaded" in result.error
    assert result.output_tokens == 1


@pytest.mark.parametrize(
    ("reply", "status", "words", "code"),
    [
        (
            json_reply(
                429, {"error": {"message": "Rate limit reached", "code": "rate_limit_exceeded"}}, "Retry-After: 2\r\n"
            ),
            429,
            "Rate limit reached",
            "rate_limit_exceeded",
        ),
        (
            json_reply(503, {"error": {"message": "The engine is currently busy", "type": "x", "code": 503}}),
            503,
            "currently busy",
            503,
        ),
        (
            b"HTTP/1.1 500 Internal Server Error\r\nContent-Type: text/plain\r\nContent-Length: 21\r\n\r\n"
            b"Internal Server Error",
            500,
            "Internal Server Error",
            None,
        ),
        (json_reply(400, {"detail": [{"msg": "ignore_eos is not allowed"}]}), 400, "ignore_eos", None),
    ],
)
def test_http_errors_keep_status_and_message(reply, status, words, code):
    with RawServer(lambda request: [reply]) as server:
        result = run(one(server.url, "p", 10, client_options={"model": "m"}))
    assert result.error_kind == "http" and result.status == status and result.error_code == code
    assert result.error.startswith(f"HTTP {status}: ") and words in result.error
    assert result.retry_after_seconds == (2.0 if status == 429 else None)
    assert result.token_times == [] and result.output_tokens is None


def test_a_stalled_server_is_a_timeout_with_what_arrived():
    stalled_mid = sse_script(text_event(" a"), tail=[3.0])
    stalled_before = lambda request: [3.0]  # noqa: E731
    with RawServer(stalled_mid) as mid, RawServer(stalled_before) as before:
        options = {"model": "m", "timeout_seconds": 0.4}
        started = time.monotonic()
        mid_result = run(one(mid.url, "p", 10, client_options=options))
        before_result = run(one(before.url, "p", 10, client_options=options))
        assert time.monotonic() - started < 2.5
    assert mid_result.error_kind == "timeout" and "no bytes" in mid_result.error and mid_result.output_tokens == 1
    assert before_result.error_kind == "timeout" and "no answer" in before_result.error
    assert before_result.status is None


def test_a_refused_connection_is_a_connect_error():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed when the block ends: nothing listens there
    result = run(one(f"http://127.0.0.1:{port}", "p", 10, client_options={"model": "m"}))
    assert result.error_kind == "connect" and "refused" in result.error and result.status is None
    assert result.ended_at >= result.started_at


def test_usage_missing_falls_back_to_counting_events():
    with RawServer(sse_script(text_event(" a"), text_event(" b"), text_event("", "length"), DONE)) as server:
        result = run(one(server.url, "p", 10, client_options={"model": "m"}))
    assert result.ok and result.output_tokens == 2 and result.output_tokens_from == "chunks"
    assert result.prompt_tokens is None


def test_awkward_but_valid_streams_are_read_right():
    """CRLF line endings, events split byte by byte, spaced JSON, escapes, comments and multi-line data."""
    events = [
        b": keep-alive comment\r\n\r\n",
        b'event: message\r\ndata: {"choices": [{"index": 0, "text": "a\\nb"}]}\r\n\r\n',
        b'data: {"choices":[{"index":0,"text":"\\u00e9t\\u00e9"}]}\n\n',
        b'data: {"choices": [{"index": 0,\ndata: "text": "two lines"}]}\n\n',
        usage_event(4, 3),
        DONE,
    ]
    dribbled = [SSE_HEAD] + [chunk(bytes([b])) for e in events for b in e] + [END]
    with RawServer(lambda request: dribbled) as server:
        result = run(one(server.url, "p", 10, client_options={"model": "m"}))
    assert result.ok, result.error
    assert len(result.token_times) == 3 and result.output_tokens == 3 and result.output_tokens_from == "usage"
    assert result.received_text_chars == len("a\nb") + len("été") + len("two lines")
    assert result.prompt_tokens == 4


def test_sse_framed_by_length_or_by_close():
    body = text_event(" a") + usage_event(1, 1) + DONE
    by_length = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: %d\r\n\r\n" % len(body)) + body
    by_close = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"
    with (
        RawServer(lambda request: [by_length]) as length_server,
        RawServer(lambda request: [by_close, body, CLOSE]) as close_server,
        RawServer(lambda request: [by_close, text_event(" a"), CLOSE]) as cut_server,
    ):
        options = {"model": "m"}
        framed, closed, cut = (
            run(one(s.url, "p", 5, client_options=options)) for s in (length_server, close_server, cut_server)
        )
    assert framed.ok and framed.output_tokens == 1 and framed.output_tokens_from == "usage"
    assert closed.ok and closed.output_tokens == 1
    assert cut.error_kind == "stream" and "without data: [DONE]" in cut.error and cut.output_tokens == 1


def test_connections_are_reused_and_a_stale_one_is_retried():
    answer = [SSE_HEAD, chunk(text_event(" a")), chunk(usage_event(1, 1)), chunk(DONE), END]
    with RawServer(lambda request: answer) as kept, RawServer(lambda request: [*answer, 0.05, CLOSE]) as dropped:

        async def three(url):
            async with OpenAIClient(url, model="m") as client:
                results = []
                for _ in range(3):
                    results.append(await client.complete("p", 1))
                    await asyncio.sleep(0.2)  # lets the dropping server close the idle connection
                return results

        reused, retried = run(three(kept.url)), run(three(dropped.url))
    assert all(r.ok for r in reused + retried), [r.error for r in reused + retried]
    assert kept.connections == 1 and {r.connection for r in kept.seen} == {1}
    assert dropped.connections == 3


def test_max_connections_caps_requests_in_flight():
    slow = [SSE_HEAD, 0.3, chunk(text_event(" a")), chunk(DONE), END]
    with RawServer(lambda request: slow) as server:

        async def main():
            async with OpenAIClient(server.url, model="m", max_connections=2) as client:
                return await asyncio.gather(*(client.complete("p", 1) for _ in range(4)))

        results = run(main())
    assert all(r.ok for r in results) and server.connections == 2
    starts = sorted(r.started_at for r in results)
    assert starts[2] >= min(r.ended_at for r in results)  # the third waited for a slot


def test_headers_and_the_api_key_are_sent_and_kept_out_of_errors():
    secret = "sk-test-DO-NOT-PRINT"
    reply = json_reply(401, {"error": {"message": "Invalid API key"}})
    with RawServer(lambda request: [reply]) as server:
        client = OpenAIClient(server.url, model="m", api_key=secret, headers={"X-Tenant": "team-a"})
        result = run(
            one(server.url, "p", 3, client_options={"model": "m", "api_key": secret, "headers": {"X-Tenant": "team-a"}})
        )
    seen = server.seen[0]
    assert seen.headers["authorization"] == f"Bearer {secret}" and seen.headers["x-tenant"] == "team-a"
    assert seen.headers["x-request-id"] == result.request_id and seen.path == "/v1/completions"
    sent = json.loads(seen.body)
    assert sent["stream"] is True and sent["stream_options"] == {"include_usage": True} and sent["ignore_eos"] is True
    assert result.error_kind == "http" and result.status == 401
    assert secret not in repr(result) and secret not in repr(client) and secret not in (result.error or "")
    with pytest.raises(UsageError):
        OpenAIClient(server.url, headers={"X-Bad": "a\r\nInjected: yes"})
    with pytest.raises(UsageError):
        client.new_result("id\r\nInjected: yes")


def test_tls_with_a_self_signed_certificate(tmp_path):
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command to make a certificate")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            str(key),
            "-out",
            str(cert),
            "-days",
            "1",
            "-subj",
            "/CN=localhost",
        ],
        check=True,
        capture_output=True,
    )
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    answer = sse_script(text_event(" a"), text_event(" b"), usage_event(2, 2), DONE)
    with RawServer(answer, tls=context) as server:
        trusted = run(one(server.url, "p", 2, client_options={"model": "m", "insecure": True}))
        refused = run(one(server.url, "p", 2, client_options={"model": "m"}))
    assert trusted.ok and trusted.output_tokens == 2 and len(trusted.token_times) == 2, trusted.error
    assert refused.error_kind == "connect" and "certificate" in refused.error and "pass insecure" in refused.error


def test_a_non_http_answer_is_a_stream_error():
    with RawServer(lambda request: [b"SSH-2.0-OpenSSH_9.2\r\n\r\n", CLOSE]) as server:
        result = run(one(server.url, "p", 3, client_options={"model": "m"}))
    assert result.error_kind == "stream" and "not an HTTP answer" in result.error


def test_cancelling_a_request_records_it_as_cancelled_with_what_arrived():
    slow = sse_script(text_event(" a"), tail=[5.0])
    with RawServer(slow) as server:

        async def main():
            async with OpenAIClient(server.url, model="m") as client:
                result = client.new_result()
                task = asyncio.create_task(client.execute(RequestPlan("p", 5), result))
                while not result.token_times:
                    await asyncio.sleep(0.01)
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
                return result

        result = run(main())
    assert result.error_kind == "cancelled" and result.output_tokens == 1 and result.ended_at >= result.started_at


# --- rejections under load, and the real-vLLM tests' driver --------------------------------------------------


def test_rejections_are_counted_and_backed_off_never_fatal():
    from llmdiag.sim.load import ClosedLoopLoad
    from llmdiag.sim.presets import LoadSpec

    engine = EngineConfig(get_preset("healthy").deployment, max_num_queued_reqs=1, extra_step_overhead_seconds=0.02)
    with SimServer(engine) as server:

        async def main():
            async with OpenAIClient(server.url) as client:
                return await closed_loop(
                    client, 6, plans(20), duration_seconds=1.5, max_requests=None, error_backoff_seconds=0.2
                )

        results = run(main())
        with ClosedLoopLoad(server.url, server.model, LoadSpec(6, 4, 20), max_seconds=1.5) as load:
            load.wait(10)
    rejected = [r for r in results if r.error_kind == "http"]
    assert rejected and all(r.status == 503 and r.error_code == 503 for r in rejected)
    assert any(r.ok for r in results) and {r.error_kind for r in results} <= {None, "http", "cancelled"}
    # each user waits 0.2 s after a rejection: at most ~8 rejections per user in 1.5 s, not thousands
    assert len(rejected) <= 6 * 9
    assert load.tally.rejected > 0 and load.tally.ok > 0 and not load.tally.errors


def test_the_real_vllm_tests_load_driver_runs_on_the_simulator(sim):
    from tests.realserver.loadgen import Load

    with Load(sim.url, sim.model, users=3, prompt_tokens=32, output_tokens=8, max_seconds=30) as load:
        deadline = time.monotonic() + 20
        while load.stats.ok < 5 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert load.running
    summary = load.stats.as_dict()
    assert load.error is None and load.stats.ok >= 5 and load.stats.errors_total == 0, summary
    assert summary["prompt_tokens_measured"] == 32 and summary["prompt_words"] == 32  # /tokenize calibrated
    assert load.stats.completion_tokens == 8 * load.stats.ok and load.stats.cancelled == 3
    assert load.started_at is not None and load.stopped_at is not None


def test_many_first_requests_share_one_model_lookup():
    answer = [SSE_HEAD, chunk(text_event(" a")), chunk(DONE), END]

    def script(request: Seen) -> list:
        if request.path == "/v1/models":
            return [0.2, json_reply(200, {"object": "list", "data": [{"id": "the-model", "object": "model"}]})]
        return answer

    with RawServer(script) as server:

        async def main():
            async with OpenAIClient(server.url) as client:
                return await asyncio.gather(*(client.complete("a", 1) for _ in range(10)))

        results = run(main())
    assert all(r.ok for r in results), [r.error for r in results]
    assert [r.path for r in server.seen].count("/v1/models") == 1
    assert {json.loads(r.body)["model"] for r in server.seen if r.path == "/v1/completions"} == {"the-model"}
