"""Canary requests in `llmdiag scan`: what a user sees, measured through the API beside the server's histograms.

Real parts only: the simulator on 127.0.0.1 under its bounded load, and a real reverse proxy in front of it that
holds every API answer back (a buffering gateway), so the gap between client and server TTFT is real.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import aiohttp
import pytest
from aiohttp import web

from llmdiag.sim.load import ClosedLoopLoad
from llmdiag.sim.presets import get_preset
from llmdiag.sim.server import SimServer
from tests.conftest import run_cli

PROXY_DELAY_SECONDS = 1.0


@contextmanager
def delaying_proxy(upstream: str, delay_seconds: float) -> Iterator[str]:
    """A reverse proxy that waits ``delay_seconds`` before forwarding any /v1 request; /metrics passes at once."""
    loop = asyncio.new_event_loop()
    started = threading.Event()
    box: dict = {}

    async def forward(request: web.Request) -> web.StreamResponse:
        if request.path.startswith("/v1/"):
            await asyncio.sleep(delay_seconds)
        try:
            body = await request.read()
        except ConnectionResetError:  # the scan ended and cancelled its last canary while we held it back
            return web.Response(status=499)
        async with box["session"].request(
            request.method,
            upstream + request.path_qs,
            data=body,
            headers={"Content-Type": request.headers.get("Content-Type", "")},
        ) as up:
            content_type = up.headers.get("Content-Type", "")
            response = web.StreamResponse(status=up.status, headers={"Content-Type": content_type})
            await response.prepare(request)
            async for chunk in up.content.iter_any():
                await response.write(chunk)
            await response.write_eof()
            return response

    async def main() -> None:
        box["session"] = aiohttp.ClientSession()
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", forward)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        box["url"] = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # noqa: SLF001
        box["runner"] = runner
        started.set()

    thread = threading.Thread(target=lambda: (loop.run_until_complete(main()), loop.run_forever()), daemon=True)
    thread.start()
    assert started.wait(10)
    try:
        yield box["url"]
    finally:

        async def stop() -> None:
            await box["runner"].cleanup()
            await box["session"].close()

        asyncio.run_coroutine_threadsafe(stop(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)


def scan(url: str, *extra: str, duration: str = "8") -> dict:
    result = run_cli(
        "scan", url, "--duration", duration, "--json", "--no-nvml", "--fail-on", "never", *extra, timeout=120
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def canary_probe(verdict: dict) -> dict:
    [probe] = [p for p in verdict["coverage"]["probes"] if p["probe"] == "canary"]
    return probe


def test_canaries_see_what_the_server_measures_when_nothing_is_in_between():
    preset = get_preset("healthy")
    with SimServer(preset) as sim, ClosedLoopLoad(sim.url, sim.model, preset.load, max_seconds=60):
        time.sleep(2)
        verdict = scan(sim.url)
    probe = canary_probe(verdict)
    assert probe["ok"] and probe["config"]["model"] == sim.model and probe["config"]["requests"].endswith("0 failed")
    exp = verdict["experience"]
    assert exp["client_requests"] >= 3
    client, server = exp["client_ttft_p50_seconds"], exp["ttft_p50_seconds"]
    assert client > 0 and server > 0
    # the canaries cross the same loopback HTTP server the simulator times from: no gap worth a finding
    assert verdict["signals"]["client_ttft_gap_seconds"]["stats"]["value"] < 0.25
    sch007 = next(r for r in verdict["coverage"]["rules"] if r["code"] == "SCH007")
    assert sch007["status"] == "passed", sch007


def test_a_buffering_proxy_shows_up_as_the_gap_between_client_and_server():
    preset = get_preset("healthy")
    with (
        SimServer(preset) as sim,
        ClosedLoopLoad(sim.url, sim.model, preset.load, max_seconds=60),
        delaying_proxy(sim.url, PROXY_DELAY_SECONDS) as proxy,
    ):
        time.sleep(2)
        verdict = scan(proxy, duration="12")  # each canary takes the proxy's second: enough of them to judge
    finding = next(f for f in verdict["findings"] if f["code"] == "SCH007")
    evidence = {(e["signal"], e["stat"]): e["value"] for e in finding["evidence"]}
    gap = evidence[("client_ttft_gap_seconds", "value")]
    assert PROXY_DELAY_SECONDS * 0.8 <= gap <= PROXY_DELAY_SECONDS * 3, gap
    client = verdict["experience"]["client_ttft_p50_seconds"]
    assert client >= PROXY_DELAY_SECONDS
    # the gap is the proxy's share of what the client waited for its first token
    assert evidence[("client_ttft_gap_ratio", "value")] == pytest.approx(gap / client, rel=1e-6)
    assert verdict["experience"]["ttft_p50_seconds"] < 0.5  # the engine never saw the wait


def test_no_probe_and_metrics_url_leave_the_api_alone_and_say_so():
    preset = get_preset("healthy")
    with SimServer(preset) as sim:
        verdict_off = scan(sim.url, "--no-probe", duration="2")
        verdict_metrics_only = scan(sim.url, "--metrics-url", f"{sim.url}/metrics", duration="2")
    assert canary_probe(verdict_off)["note"] == "canary requests: not sent (--no-probe)"
    assert "--metrics-url given" in canary_probe(verdict_metrics_only)["note"]
    for verdict in (verdict_off, verdict_metrics_only):
        assert "client_ttft_seconds" not in verdict["signals"]
        assert verdict["experience"]["client_requests"] is None


def test_a_server_without_an_api_gives_a_canary_coverage_line_and_still_a_verdict():
    from tests.e2e.test_bad_input import growing_vllm
    from tests.support.httpserver import ScriptedServer

    with ScriptedServer(growing_vllm) as server:
        result = run_cli("scan", server.url, "--duration", "2", "--json", "--no-nvml", timeout=60)
    assert result.returncode in (0, 1) and "Traceback" not in result.stderr, result.stderr
    probe = canary_probe(json.loads(result.stdout))
    assert probe["ok"] is False and probe["note"].startswith("canary requests: unavailable (")


def test_an_idle_server_stays_idle_apart_from_the_canaries_themselves():
    with SimServer(get_preset("healthy")) as sim:
        verdict = scan(sim.url, duration="5")
    assert canary_probe(verdict)["ok"] and verdict["experience"]["client_requests"] >= 2
    assert verdict["bottleneck"] == "idle", verdict["summary"]
    assert "besides this scan's" in verdict["summary"] and "canary requests" in verdict["summary"]
    # the server did count the canaries' tokens: they are what the idle test allows, and no more
    generated = verdict["signals"]["generation_tokens_per_second"]["stats"]["increase"]
    assert 0 < generated <= verdict["signals"]["client_output_tokens"]["stats"]["value"]
