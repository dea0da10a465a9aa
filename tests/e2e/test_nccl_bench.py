"""`llmdiag nccl-bench`: the collective benchmark under torchrun, 2 CPU ranks with gloo on 127.0.0.1.

Structure and plausibility only (2 noisy cores, no GPU): every op x size is there, busbw is algbw times
nccl-tests' factor, bandwidth grows with the message size, and with no NVML the link is "unavailable", not a number.
The pure parts (sizes, bus factors, signals, the judgement, the table) are tested on made-up reports.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from llmdiag.api.nccl import judge_nccl_bench, run_nccl_bench
from llmdiag.cli.nccl_rank import parse_args
from llmdiag.collect.nccl.busbw import bus_factor, element_count, measurement
from llmdiag.collect.nccl.launch import failure_line
from llmdiag.collect.nccl.options import OPS, bench_options, parse_sizes
from llmdiag.collect.nccl.signals import bench_signals
from llmdiag.errors import BenchUsageError, UsageError
from llmdiag.model import BenchLink, CollectiveMeasurement, NcclBenchReport
from llmdiag.model.report import SCHEMA_VERSION
from llmdiag.render.nccl import render_nccl_bench

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


def _report(link_expected: float | None, seconds: float = 0.01, size: int = 1024**3) -> NcclBenchReport:
    """A measured, unjudged report of 8 ranks: all_reduce at one size."""
    return NcclBenchReport(
        torch_version="2.13.0",
        backend="nccl",
        world_size=8,
        local_world_size=8,
        nodes=1,
        device="NVIDIA H100 80GB HBM3",
        iters=20,
        warmup=5,
        trials=3,
        size_cap_bytes=None,
        size_cap_reason="a quarter of free GPU memory",
        elapsed_seconds=10.0,
        link=BenchLink(
            name="nvlink4" if link_expected else None,
            title="NVLink 4" if link_expected else "",
            how="test",
            expected_bus_bandwidth_bytes_per_second=link_expected,
            unavailable=None if link_expected else "no NVML (test)",
        ),
        results=[measurement("all_reduce", size, size // 4, 8, [(seconds, seconds * 1.1)])],
    )


def _codes(report: NcclBenchReport) -> list[str]:
    return [f.code for f in judge_nccl_bench(report).findings]


def test_signals_carry_the_ratio_to_the_link_or_say_why_not():
    signals = bench_signals(_report(360e9))
    busbw = signals.get("collective_bus_bandwidth_bytes_per_second").stat("value")
    assert busbw == pytest.approx(1024**3 / 0.01 * 1.75)
    assert signals.get("collective_bus_bandwidth_vs_link_ratio").stat("value") == pytest.approx(busbw / 360e9)
    assert signals.get("collective_message_bytes").stat("value") == 1024**3
    missing = bench_signals(_report(None)).get("collective_bus_bandwidth_vs_link_ratio")
    assert missing.stat("value") is None and "no NVML" in missing.unavailable
    assert isinstance(measurement("all_gather", 8, 2, 2, [(1.0, 1.0)]), CollectiveMeasurement)


def test_a_slow_link_fires_the_network_rule_and_a_healthy_one_does_not():
    assert "NET009" in _codes(_report(360e9, seconds=0.1))  # ~19 GB/s busbw
    assert "NET009" not in _codes(_report(360e9))  # ~188 GB/s: 52 %
    assert "NET009" not in _codes(_report(None))  # no link: skipped, not fired
    small = _report(360e9, size=1024**2)  # 1 MiB: latency
    ratio = bench_signals(small).get("collective_bus_bandwidth_vs_link_ratio")
    assert ratio.unavailable and "latency-bound" in ratio.unavailable
    assert "NET009" not in _codes(small)


def test_the_judged_report_is_versioned_and_keeps_only_the_benchmarks_signals():
    report = judge_nccl_bench(_report(360e9, seconds=0.1))
    assert report.schema_version == SCHEMA_VERSION and report.tool_version
    assert set(report.signals) == {
        "collective_bus_bandwidth_bytes_per_second",
        "collective_message_bytes",
        "expected_link_bus_bandwidth_bytes_per_second",
        "collective_bus_bandwidth_vs_link_ratio",
        "device_memory_copy_bandwidth_bytes_per_second",
        "device_memory_copy_vs_peak_ratio",
    }
    again = NcclBenchReport.model_validate_json(report.model_dump_json())
    assert again == report


def test_the_table_shows_rows_the_link_ratio_and_the_findings():
    report = _report(360e9, seconds=0.1)
    report.failed_ops = {"all_gather": "wrong result: all_gather gave [1.0], want [1.0, 2.0]"}
    text = render_nccl_bench(judge_nccl_bench(report))
    lines = text.splitlines()
    assert lines[0] == (
        "llmdiag nccl-bench: nccl, 8 rank(s) on 1 node(s), NVIDIA H100 80GB HBM3, torch 2.13.0, float32, "
        "20 iters x 3 trials"
    )
    assert lines[1] == "link: nvlink4 (NVLink 4; test), expected busbw 360.000 GB/s"
    assert lines[3] == "all_reduce       1073741824    100000.0      10.737      18.790"
    assert "all_gather: FAILED: wrong result" in text
    assert "busbw vs link: 5% of the expected busbw (all ops: all_reduce 5%)" in text
    assert lines[-1].startswith("CRITICAL NET009: ")


def test_the_arguments_are_checked_before_anything_starts():
    options = bench_options("1K:4K", "all-reduce,all_gather,all_reduce", max_size="2K", link="NVLink4")
    assert options.sizes == [1024, 2048, 4096] and options.ops == ["all_reduce", "all_gather"]
    assert options.max_size_bytes == 2048 and options.link == "nvlink4" and options.check
    for kwargs, words in [
        ({"iters": 0}, "^iters must be at least 1"),
        ({"warmup": -1}, "^warmup cannot be negative"),
        ({"ops": "broadcast"}, "unknown collective broadcast"),
        ({"link": "nvlink9"}, "unknown link class 'nvlink9'"),
    ]:
        with pytest.raises(BenchUsageError, match=words) as caught:
            run_nccl_bench(**kwargs)  # raises before torchrun: no torch, no process
        assert isinstance(caught.value, UsageError) and caught.value.hint
    with pytest.raises(BenchUsageError, match="^nproc_per_node must be at least 1"):
        run_nccl_bench(nproc_per_node=0)


def test_the_torchrun_command_line_parses_to_the_same_options():
    options, json_out = parse_args(["--sizes", "64M", "--ops", "all_to_all", "--no-check", "--json", "-"])
    assert options == bench_options("64M", "all_to_all", check=False) and json_out == "-"
    with pytest.raises(BenchUsageError, match="argument --iters: invalid int value"):
        parse_args(["--iters", "many"])


def test_a_failed_rank_is_named_by_its_last_error_line():
    log = (
        "[rank1]: Traceback (most recent call last):\n"
        '[rank1]:   File "bench.py", line 1, in <module>\n'
        "[rank1]: llmdiag.errors.BenchUsageError: local rank 1 but only 1 GPU(s) visible\n"
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n"
    )
    assert failure_line(log) == "local rank 1 but only 1 GPU(s) visible"
    assert failure_line("RuntimeError: NCCL error in: ...\n") == "RuntimeError: NCCL error in: ..."
    assert failure_line("") == "(no output)"


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
    assert report["schema_version"] == SCHEMA_VERSION and report["tool_version"]
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


def test_torchrun_runs_the_module_users_run_by_hand():
    """`torchrun -m llmdiag.nccl_bench`, as the README documents for runs llmdiag does not launch: rank 0 judges
    and prints (here the report as JSON, --json -)."""
    pytest.importorskip("torch", reason="the torch extra is not installed")
    from llmdiag.collect.nccl.launch import free_port, torchrun_command
    from tests.conftest import REPO_ROOT

    args = ["--sizes", "1K:4K", "--ops", "all_reduce,all_to_all", "--iters", "2", "--warmup", "0", "--trials", "1"]
    command = torchrun_command(2, [*args, "--json", "-"], free_port(), module="llmdiag.nccl_bench")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore::FutureWarning"}
    proc = subprocess.run(command, capture_output=True, text=True, cwd=REPO_ROOT, env=env, timeout=240)
    assert proc.returncode == 0, proc.stderr
    report = NcclBenchReport.model_validate_json(proc.stdout)
    assert report.world_size == 2 and report.schema_version == SCHEMA_VERSION
    assert {(m.op, m.size_bytes) for m in report.results} == {
        (op, size) for op in ("all_reduce", "all_to_all") for size in (1024, 2048, 4096)
    }
    assert report.signals["collective_bus_bandwidth_bytes_per_second"].stats["value"] > 0
    bad = subprocess.run(
        [sys.executable, "-m", "llmdiag.nccl_bench", "--ops", "broadcast"],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=60,
    )
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr.splitlines() == [
        "ERROR: unknown collective broadcast",
        "HINT: --ops takes all_reduce,all_gather,reduce_scatter,all_to_all",
    ]
