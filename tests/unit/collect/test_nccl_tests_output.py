"""nccl-tests output (llmdiag.collect.nccl.tests_output) read into the bench's signals, on real outputs
(tests/fixtures/nccl/nccl-tests, provenance in its README) and the field corpus's excerpts. Every expected figure is
read off the fixture text by eye; the link figures come from probes/links.toml through describe_link.
"""

from __future__ import annotations

import pytest

from llmdiag.collect.evidence import classify, read_head
from llmdiag.collect.nccl.tests_output import (
    NcclTestsOutput,
    collect_nccl_tests,
    expected_link,
    looks_like_nccl_tests,
    parse_nccl_tests,
)
from llmdiag.errors import InputFileError
from llmdiag.model import SignalSet
from llmdiag.schema.links import describe_link
from llmdiag.schema.loader import load_signal_registry
from tests.conftest import FIXTURES

OUTPUTS = FIXTURES / "nccl" / "nccl-tests"
FIELD = FIXTURES / "field"


def collect(name: str) -> SignalSet:
    return collect_nccl_tests((OUTPUTS / name).read_text(), name)


def value(signals: SignalSet, name: str) -> float | None:
    signal = signals.get(name)
    assert signal is not None, name
    return signal.stat("value")


@pytest.mark.parametrize("name", sorted(p.name for p in OUTPUTS.glob("*.txt")))
def test_every_output_is_recognised_and_taken_by_its_kind(name: str):
    assert looks_like_nccl_tests((OUTPUTS / name).read_text())
    assert classify(read_head(OUTPUTS / name)).name == "nccl-tests"


def test_a_run_that_hung_before_its_first_row_is_an_nccl_log_not_nccl_tests():
    # the header and the ranks are there, no result row: NCCL's lines are what it has to say
    hang = FIXTURES / "nccl" / "gtx1080ti-x4-allreduce-hang.txt"
    assert not looks_like_nccl_tests(hang.read_text())
    assert classify(read_head(hang)).name == "nccl-log"


def test_two_hosts_busbw_at_the_largest_size_and_the_network_link_unknown():
    signals = collect("h100-x16-2node-allreduce.txt")
    # 8589934592 B row: out-of-place 338.82, in-place 337.35 GB/s: the better one
    assert value(signals, "collective_bus_bandwidth_bytes_per_second") == pytest.approx(338.82e9)
    assert value(signals, "collective_message_bytes") == 8589934592
    for name in ("expected_link_bus_bandwidth_bytes_per_second", "collective_bus_bandwidth_vs_link_ratio"):
        why = signals.signals[name].unavailable
        assert why and "2 hosts" in why, why
    source = signals.sources[0]
    assert source.config["ranks"] == "16" and source.config["hosts"] == "2"
    assert source.config["collective"] == "all_reduce"
    assert source.config["avg_bus_bandwidth"].startswith("70.742 GB/s")
    assert source.config["gpus"] == "16 × NVIDIA H100 80GB HBM3"


def test_one_host_of_a_gpu_without_a_known_link_says_so():
    signals = collect("rtx4090-x4-large-sizes.txt")
    assert value(signals, "collective_bus_bandwidth_bytes_per_second") == pytest.approx(25.95e9)
    assert value(signals, "collective_message_bytes") == 1073741824
    why = signals.signals["collective_bus_bandwidth_vs_link_ratio"].unavailable
    assert why and "RTX 4090" in why


def test_the_oldest_rows_without_redop_or_root():
    out = parse_nccl_tests((OUTPUTS / "rtx2080ti-x2-oldest-format.txt").read_text())
    assert len(out.rows) == 13
    assert out.rows[0].size_bytes == 32768 and out.rows[0].busbw_bytes_per_second == pytest.approx(1.38e9)
    assert out.rows[-1].size_bytes == 134217728 and out.rows[-1].busbw_bytes_per_second == pytest.approx(21.86e9)
    assert out.rows[-1].root is None and out.rows[-1].redop == ""


def test_rows_with_redop_and_no_root_and_markdown_lost_hashes():
    out = parse_nccl_tests((OUTPUTS / "a100-x2-no-root-column.txt").read_text())
    assert [r.size_bytes for r in out.rows] == [32, 64]
    assert out.rows[-1].busbw_bytes_per_second == pytest.approx(0.01e9) and out.rows[-1].root is None
    assert out.hosts == {"AI-A100-Beethoven01"} and out.ranks == 2


def test_a_cut_row_is_no_row_and_small_sizes_give_no_ratio():
    text = (FIELD / "nccl-tests-after-acs-fix-small-sizes-only" / "nccl.log").read_text()
    out = parse_nccl_tests(text)
    # rows 8 … 256 B are whole; '512  128  float  sum  -1' is cut before its figures
    assert [r.size_bytes for r in out.rows] == [8, 16, 32, 64, 128, 256]
    signals = collect_nccl_tests(text, "nccl.log")
    assert value(signals, "collective_message_bytes") == 256
    assert signals.signals["collective_bus_bandwidth_vs_link_ratio"].unavailable


def test_the_tail_of_a_table_with_its_summary():
    text = (FIELD / "nccl-tests-allreduce-at-target-busbw" / "nccl.log").read_text()
    signals = collect_nccl_tests(text, "nccl.log")
    # last row 133169160 B: 95.74 out-of-place, 95.94 in-place
    assert value(signals, "collective_bus_bandwidth_bytes_per_second") == pytest.approx(95.94e9)
    assert signals.sources[0].config["avg_bus_bandwidth"].startswith("84.8558 GB/s")
    assert "no ranks" in (signals.signals["expected_link_bus_bandwidth_bytes_per_second"].unavailable or "")


def test_the_link_of_one_host_of_nvlink_gpus_is_their_nvlink_class():
    h100 = describe_link("nvlink4")
    assert h100 is not None
    one_host = NcclTestsOutput(hosts={"node"}, gpus={"NVIDIA H100 80GB HBM3": 8})
    name, expected, how = expected_link(one_host)
    assert name == "nvlink4" and expected == h100.expected_bus_bandwidth_bytes_per_second, how
    pcie = NcclTestsOutput(hosts={"node"}, gpus={"NVIDIA H100 PCIe": 8})
    assert expected_link(pcie)[0] is None


def test_no_whole_row_is_refused():
    with pytest.raises(InputFileError):
        collect_nccl_tests(
            "#       size         count      type   redop    root     time   algbw   busbw #wrong\n", "x"
        )


def test_a_connection_over_the_network_means_the_network_link_whatever_the_rank_list():
    # nccl-tests #252's NCCL lines: P2P/CUMEM inside each host and '[send] via NET/IBext_v8/0/GDRDMA' between them
    lines = (FIXTURES / "nccl" / "multinode-ib-p2p-cumem.txt").read_text()
    transports = {via for via in lines.split() if via.startswith(("NET/", "P2P/"))}
    assert any(via.startswith("NET/") for via in transports)
    one_host = NcclTestsOutput(hosts={"node"}, gpus={"NVIDIA H100 80GB HBM3": 8})
    name, expected, how = expected_link(one_host, transports)
    assert name is None and expected is None and "via NET" in how


def test_rows_tagged_by_the_launcher():
    signals = collect("mpirun-tagged-rows-allreduce-collapse.txt")
    out = parse_nccl_tests((OUTPUTS / "mpirun-tagged-rows-allreduce-collapse.txt").read_text())
    assert len(out.rows) == 10 and out.rows[0].size_bytes == 1048576
    # 536870912 B: 5.31 out-of-place, 5.33 in-place; 33554432 B reached 29.50 before the collapse
    assert value(signals, "collective_bus_bandwidth_bytes_per_second") == pytest.approx(5.33e9)
    assert out.rows[5].busbw_bytes_per_second == pytest.approx(29.50e9)


def test_nccl_tests_output_with_number_free_nccl_lines_is_read_whole():
    # plugin-loading INFO lines (no number NCCL chose) above a real table: the table is the data, nothing refuses it
    plugins = (FIXTURES / "nccl" / "plugins-only.txt").read_text()
    path = FIXTURES / "nccl" / "nccl-tests" / "rtx4090-x4-large-sizes.txt"
    text = plugins + path.read_text()
    assert value(collect_nccl_tests(text, "x"), "collective_bus_bandwidth_bytes_per_second") == pytest.approx(25.95e9)


@pytest.mark.parametrize("name", sorted(p.name for p in OUTPUTS.glob("*.txt")))
def test_every_signal_is_declared_for_the_nccl_tests_producer(name: str):
    registry = load_signal_registry()
    signals = collect(name)
    assert registry.produced_problems(signals.signals.values(), "nccl-tests") == []
    assert set(signals.signals) == set(registry.produced_by("nccl-tests"))
