"""`llmdiag nccl-bench`: the collective benchmark under torchrun, 2 CPU ranks with gloo on 127.0.0.1.

Structure and plausibility only (2 noisy cores, no GPU): every op x size is there, busbw is algbw times
nccl-tests' factor, bandwidth grows with the message size, and with no NVML the link is "unavailable", not a number.
"""

from __future__ import annotations

import json

import pytest

from llmdiag.nccl_bench import (
    OPS,
    BenchUsageError,
    Measurement,
    build_signals,
    bus_factor,
    element_count,
    judge,
    measurement,
    parse_sizes,
)

KIB = 1024


def test_sizes_are_powers_of_two_like_nccl_tests():
    assert parse_sizes("1K:1M") == [KIB * 2**i for i in range(11)]
    assert parse_sizes("1K:1G")[-1] == 1024**3
    assert parse_sizes("64M") == [64 * 1024**2]
    assert parse_sizes("4K,1K") == [1024, 4096]
    for bad in ("1K:zz", "0", "1M:1K", "-1K"):
        with pytest.raises(BenchUsageError):
            parse_sizes(bad)


@pytest.mark.parametrize(
    ("op", "n", "factor"),
    [
        ("all_reduce", 2, 1.0),
        ("all_reduce", 8, 1.75),
        ("all_gather", 8, 0.875),
        ("reduce_scatter", 4, 0.75),
        ("all_to_all", 2, 0.5),
        ("all_reduce", 1, 0.0),
    ],
)
def test_bus_factors_are_nccl_tests(op, n, factor):
    assert bus_factor(op, n) == factor


def test_measurement_keeps_the_median_trial_and_rounds_to_whole_shares():
    assert element_count("all_gather", 1000, 3) % 3 == 0
    m = measurement("all_reduce", 4096, 1024, 4, [(3.0, 3.5), (1.0, 1.1), (2.0, 2.5)])
    assert m.time_seconds == 2.0 and m.time_max_rank_seconds == 2.5
    assert m.algbw_bytes_per_second == 4096 / 2.0
    assert m.busbw_bytes_per_second == m.algbw_bytes_per_second * 1.5


def _report(link_expected: float | None) -> dict:
    m = measurement("all_reduce", 1024**3, 1024**3 // 4, 8, [(0.01, 0.011)])
    return {
        "world_size": 8,
        "backend": "nccl",
        "elapsed_seconds": 10.0,
        "link": {
            "name": "nvlink4" if link_expected else None,
            "how": "test",
            "expected_bus_bandwidth_bytes_per_second": link_expected,
            "unavailable": None if link_expected else "no NVML (test)",
        },
        "results": [vars(m)],
        "memory_probe": None,
    }


def test_signals_carry_the_ratio_to_the_link_or_say_why_not():
    signals = build_signals(_report(360e9))
    busbw = signals.get("collective_bus_bandwidth_bytes_per_second").stat("value")
    assert busbw == pytest.approx(1024**3 / 0.01 * 1.75)
    assert signals.get("collective_bus_bandwidth_vs_link_ratio").stat("value") == pytest.approx(busbw / 360e9)
    assert signals.get("collective_message_bytes").stat("value") == 1024**3
    missing = build_signals(_report(None)).get("collective_bus_bandwidth_vs_link_ratio")
    assert missing.stat("value") is None and "no NVML" in missing.unavailable
    assert isinstance(Measurement(**vars(measurement("all_gather", 8, 2, 2, [(1.0, 1.0)]))), Measurement)


def test_a_slow_link_fires_the_network_rule_and_a_healthy_one_does_not():
    slow = _report(360e9)
    slow["results"] = [vars(measurement("all_reduce", 1024**3, 1024**3 // 4, 8, [(0.1, 0.1)]))]  # ~19 GB/s busbw
    codes = [f["code"] for f in judge(slow)["findings"]]
    assert "NET009" in codes
    assert "NET009" not in [f["code"] for f in judge(_report(360e9))["findings"]]  # ~188 GB/s: 52 %
    assert "NET009" not in [f["code"] for f in judge(_report(None))["findings"]]  # no link: skipped, not fired
    small = _report(360e9)
    small["results"] = [vars(measurement("all_reduce", 1024**2, 1024**2 // 4, 8, [(0.01, 0.01)]))]  # 1 MiB: latency
    ratio = build_signals(small).get("collective_bus_bandwidth_vs_link_ratio")
    assert ratio.unavailable and "latency-bound" in ratio.unavailable
    assert "NET009" not in [f["code"] for f in judge(small)["findings"]]


# ---------------------------------------------------------------------------------------------------------------
# live: torchrun with gloo on 127.0.0.1


@pytest.fixture(scope="module")
def gloo_run(tmp_path_factory):
    pytest.importorskip("torch", reason="the torch extra (llmdiag[torch], in llmdiag[test]) is not installed")
    from tests.conftest import run_cli

    out = tmp_path_factory.mktemp("nccl") / "bench.json"
    result = run_cli(
        "nccl-bench",
        "--nproc-per-node",
        "2",
        "--sizes",
        "1K:1M",
        "--iters",
        "3",
        "--warmup",
        "1",
        "--trials",
        "1",
        "--json",
        str(out),
        timeout=240,
    )
    return result, json.loads(out.read_text()) if out.is_file() else None


def test_two_gloo_ranks_measure_every_op_and_size(gloo_run):
    result, report = gloo_run
    assert result.returncode == 0, result.stderr
    assert report["schema_version"] == 1
    assert report["world_size"] == 2 and report["backend"] == "gloo" and report["nodes"] == 1
    assert report["failed_ops"] == {}
    sizes = parse_sizes("1K:1M")
    got = {(m["op"], m["size_bytes"]) for m in report["results"]}
    assert got == {(op, size) for op in OPS for size in sizes}
    for m in report["results"]:
        assert m["time_seconds"] > 0 and m["time_max_rank_seconds"] >= m["time_seconds"] * 0.999
        assert m["algbw_bytes_per_second"] == pytest.approx(m["size_bytes"] / m["time_seconds"], rel=1e-12)
        assert m["bus_factor"] == bus_factor(m["op"], 2)
        assert m["busbw_bytes_per_second"] == m["algbw_bytes_per_second"] * bus_factor(m["op"], 2)


def test_bandwidth_grows_with_message_size(gloo_run):
    _, report = gloo_run
    for op in OPS:
        rows = {m["size_bytes"]: m["algbw_bytes_per_second"] for m in report["results"] if m["op"] == op}
        small, large = rows[KIB], rows[1024**2]
        # 1 KiB is all latency (~0.1-3 ms on gloo); 1 MiB moves ~1000x the bytes in far less than 1000x the time
        assert large > 10 * small, (op, small, large)


def test_without_nvml_the_link_is_unavailable_not_a_number(gloo_run):
    result, report = gloo_run
    link = report["link"]
    assert link["name"] is None and link["expected_bus_bandwidth_bytes_per_second"] is None
    assert "no NVML" in link["unavailable"]
    ratio = report["signals"]["collective_bus_bandwidth_vs_link_ratio"]
    assert ratio["unavailable"] and "value" not in ratio["stats"]
    busbw = report["signals"]["collective_bus_bandwidth_bytes_per_second"]
    assert busbw["stats"]["value"] > 0 and set(busbw["by_series"]) == set(OPS)
    assert "link: unavailable (no NVML" in result.stdout
    assert "busbw GB/s" in result.stdout


def test_one_rank_runs_the_memory_probe_instead(cli, tmp_path):
    pytest.importorskip("torch", reason="the torch extra is not installed")
    out = tmp_path / "one.json"
    result = cli("nccl-bench", "--nproc-per-node", "1", "--json", str(out), timeout=240)
    assert result.returncode == 0, result.stderr
    report = json.loads(out.read_text())
    assert report["results"] == [] and report["world_size"] == 1
    assert "no inter-GPU link" in report["link"]["unavailable"]
    probe = report["memory_probe"]
    assert probe["check"] == "ok" and probe["copy_bandwidth_bytes_per_second"] > 0
    assert probe["copy_vs_peak_ratio"] is None  # host memory: no NVML peak to compare with
    assert "memory-copy bandwidth probe" in result.stdout


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--sizes", "1K:zz"], "not a message size"),
        (["--ops", "all_reduce,broadcast"], "unknown collective broadcast"),
        (["--link", "nvlink9"], "unknown link class"),
        (["--iters", "0"], "--iters must be at least 1"),
        (["--nproc-per-node", "0"], "--nproc-per-node must be at least 1"),
    ],
)
def test_a_bad_argument_is_one_error_line(cli, args, words):
    result = cli("nccl-bench", *args)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert lines[0].startswith("ERROR:") and words in lines[0]
    assert len(lines) == 2 and lines[1].startswith("HINT:")
    assert "Traceback" not in result.stderr and result.stdout == ""


def test_without_torch_the_hint_names_the_extra():
    import subprocess
    import sys

    from tests.conftest import REPO_ROOT

    code = (
        "import sys; sys.modules['torch'] = None; sys.argv = ['llmdiag', 'nccl-bench']; "
        "from llmdiag.cli import main; main()"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO_ROOT, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.startswith("ERROR: nccl-bench needs PyTorch")
    assert "pip install 'llmdiag[torch]'" in proc.stderr and "Traceback" not in proc.stderr
