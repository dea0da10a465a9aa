"""NCCL debug logs and PyTorch's NCCL watchdog lines as network evidence (llmdiag.collect.nccl.logs), on real
excerpts from public threads (tests/fixtures/nccl, provenance in its README), and the NET010-NET014 findings they
make. Every expected count or duration is read off the fixture text by eye.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from llmdiag.collect.nccl.logs import collect_nccl_log, looks_like_nccl_log
from llmdiag.engine.evaluate import build_verdict
from llmdiag.errors import InputFileError
from llmdiag.model import Category, SignalSet, Verdict
from llmdiag.schema.loader import load_signal_registry
from tests.conftest import FIXTURES

NCCL = FIXTURES / "nccl"
REGISTRY = load_signal_registry()
LOGS = sorted(p.name for p in NCCL.iterdir() if p.suffix == ".txt")


def collect(name: str) -> SignalSet:
    return collect_nccl_log((NCCL / name).read_text(), name)


def value(signals: SignalSet, name: str) -> float | None:
    signal = signals.get(name)
    assert signal is not None, name
    return signal.stat("value")


def verdict(name: str) -> Verdict:
    return build_verdict(collect(name))


def finding(v: Verdict, code: str):
    found = [f for f in v.findings if f.code == code]
    assert found, f"{code} did not fire: {[(o.code, o.status, o.reason) for o in v.coverage.rules if o.code == code]}"
    return found[0]


# ---------------------------------------------------------------------------------------------
# recognising it


@pytest.mark.parametrize("name", LOGS)
def test_every_log_is_recognised(name: str):
    assert looks_like_nccl_log((NCCL / name).read_text())


@pytest.mark.parametrize(
    "path", [FIXTURES / "nvidia-smi" / "h200-idle-q.txt", FIXTURES / "logs" / "vllm-0.32-healthy.log"]
)
def test_other_texts_are_not_nccl_logs(path: Path):
    assert not looks_like_nccl_log(path.read_text())


# ---------------------------------------------------------------------------------------------
# transports, ranks, channels


def test_transports_per_connection_across_two_hosts():
    signals = collect("multinode-ib-p2p-cumem.txt")
    assert value(signals, "nccl_p2p_connections") == 8.0
    assert value(signals, "nccl_net_connections") == 7.0
    assert value(signals, "nccl_shm_connections") == 0.0  # 'via' lines are there and none says SHM: a real zero
    net = signals.get("nccl_net_connections")
    assert net is not None and net.by_series == {"NET/IBext_v8/3/GDRDMA": 4.0, "NET/IBext_v8/0/GDRDMA": 3.0}
    assert signals.sources[0].config["transports"] == "NET/IBext_v8/0/GDRDMA, NET/IBext_v8/3/GDRDMA, P2P/CUMEM"


def test_old_ring_lines_run_together_by_interleaved_ranks_still_count():
    assert value(collect("ring-p2p-ipc-interleaved.txt"), "nccl_p2p_connections") == 17.0


def test_shared_memory_between_the_gpus_of_one_host():
    signals = collect("rtx-a6000-x2-shm-direct.txt")
    assert value(signals, "nccl_shm_connections") == 3.0 and value(signals, "nccl_p2p_connections") == 0.0
    assert value(signals, "nccl_nvls_channels") == 0.0  # '0 nvls channels'
    assert signals.sources[0].config["topology"] == "trees, 2 coll channels"


def test_version_ranks_and_channels():
    hang = collect("gtx1080ti-x4-allreduce-hang.txt")
    assert hang.sources[0].config["nccl_version"] == "2.4.8+cuda10.0"
    assert value(hang, "nccl_ranks") == 4.0
    assert value(collect("stuck-after-init-8rank.txt"), "nccl_ranks") == 8.0
    assert value(collect("h800-nvls-init.txt"), "nccl_nvls_channels") == 16.0
    ray = collect("ray-p2p-ipc-peer-access-warn.txt")  # lines behind Ray's '(pid=909608) ' prefix
    assert ray.sources[0].config["nccl_version"] == "2.7.8"
    assert ray.sources[0].config["topology"] == "2 ring channels, trees"
    # no 'nranks' line: the ranks the ring ('Channel 00/02 :    0   1') and the 'via' lines name, a lower bound
    assert value(ray, "nccl_ranks") == 2.0
    assert value(collect("ring-p2p-ipc-interleaved.txt"), "nccl_ranks") == 8.0
    assert "at least" in collect("ring-p2p-ipc-interleaved.txt").signals["nccl_ranks"].source


# ---------------------------------------------------------------------------------------------
# warnings and timeouts


def test_warnings_are_sorted_by_what_failed():
    benign = collect("gtx1080ti-x4-allreduce-hang.txt")  # 'NCCL WARN Failed to open libibverbs.so[.1]'
    assert value(benign, "nccl_warnings") == 1.0
    assert value(benign, "nccl_p2p_failure_warnings") == 0.0 and value(benign, "nccl_network_error_warnings") == 0.0
    p2p = collect("ray-p2p-ipc-peer-access-warn.txt")
    assert value(p2p, "nccl_p2p_failure_warnings") == 1.0 and value(p2p, "nccl_network_error_warnings") == 0.0
    ib = collect("ib-completion-error.txt")
    assert value(ib, "nccl_network_error_warnings") == 3.0 and value(ib, "nccl_p2p_failure_warnings") == 0.0


def test_watchdog_timeouts_one_per_rank_and_collective():
    signals = collect("watchdog-timeout-allreduce.txt")
    assert value(signals, "collective_timeouts") == 2.0  # SeqNum 1580 on rank 0 and rank 4
    assert value(signals, "collective_timeout_seconds") == pytest.approx(600.067)
    assert value(signals, "collective_timeout_limit_seconds") == 600.0
    ran = signals.get("collective_timeout_seconds")
    assert ran is not None and ran.by_series == {"ALLREDUCE": pytest.approx(600.067)}
    ray = collect("vllm-ray-gather-timeout.txt")  # the same timeout printed twice on rank 1
    assert value(ray, "collective_timeouts") == 1.0
    assert value(ray, "collective_timeout_seconds") == pytest.approx(600.027)


def test_what_a_log_does_not_print_is_unavailable_not_zero():
    torch_only = collect("watchdog-timeout-allreduce.txt")  # PyTorch lines, no NCCL debug lines
    for name in ("nccl_warnings", "nccl_p2p_failure_warnings", "nccl_p2p_connections", "nccl_ranks"):
        signal = torch_only.get(name)
        assert signal is not None and signal.stat("value") is None and signal.unavailable
    assert "NCCL_DEBUG=INFO" in (torch_only.signals["nccl_warnings"].unavailable or "")
    nccl_only = collect("multinode-ib-p2p-cumem.txt")  # NCCL lines, no PyTorch watchdog lines
    timeouts = nccl_only.get("collective_timeouts")
    assert (
        timeouts is not None and timeouts.stat("value") is None and "ProcessGroupNCCL" in (timeouts.unavailable or "")
    )


@pytest.mark.parametrize("name", [n for n in LOGS if n != "plugins-only.txt"])
def test_every_signal_is_declared_for_the_nccl_log_producer(name: str):
    signals = collect(name)
    assert REGISTRY.produced_problems(signals.signals.values(), "nccl-log") == []
    assert set(signals.signals) == set(REGISTRY.produced_by("nccl-log"))


def test_a_log_without_numbers_is_refused_with_a_hint():
    with pytest.raises(InputFileError) as info:
        collect("plugins-only.txt")
    assert "plugins-only.txt" in info.value.message and "no numbers" in info.value.message
    assert "NCCL_DEBUG=INFO" in info.value.hint


# ---------------------------------------------------------------------------------------------
# the findings: hang signatures are network findings with their fixes


def test_watchdog_timeout_is_a_hang_finding():
    v = verdict("watchdog-timeout-allreduce.txt")
    net010 = finding(v, "NET010")
    assert net010.category is Category.network and net010.severity.value == "critical"
    assert "hang signature" in net010.summary
    values = {e.signal: e.value for e in net010.evidence}
    assert values["collective_timeouts"] == 2.0
    assert values["collective_timeout_seconds"] == pytest.approx(600.067)
    assert any("NCCL_P2P_DISABLE=1" in fix for fix in net010.fixes)


def test_refused_cuda_ipc_handle_is_the_p2p_hang_signature():
    net011 = finding(verdict("ray-p2p-ipc-peer-access-warn.txt"), "NET011")
    assert "hang signature" in net011.summary and net011.severity.value == "critical"
    values = {e.signal: e.value for e in net011.evidence}
    assert values["nccl_p2p_failure_warnings"] == 1.0 and values["nccl_p2p_connections"] == 1.0
    text = " ".join(net011.fixes)
    assert "NCCL_P2P_DISABLE=1" in text and "iommu=pt" in text and "ACS" in text


def test_infiniband_completion_errors_are_the_network_hang_signature():
    net014 = finding(verdict("ib-completion-error.txt"), "NET014")
    assert {e.signal: e.value for e in net014.evidence}["nccl_network_error_warnings"] == 3.0
    assert any("NCCL_IB_DISABLE=1" in fix for fix in net014.fixes)


def test_host_memory_between_gpus_is_an_advisory_finding():
    v = verdict("rtx-a6000-x2-shm-direct.txt")
    net013 = finding(v, "NET013")
    assert net013.advisory and {e.signal: e.value for e in net013.evidence}["nccl_shm_connections"] == 3.0
    assert v.bottleneck.value != "network"  # advisory: never the class


@pytest.mark.parametrize(
    "name", ["gtx1080ti-x4-allreduce-hang.txt", "multinode-ib-p2p-cumem.txt", "h800-nvls-init.txt"]
)
def test_healthy_or_harmless_logs_make_no_hang_finding(name: str):
    v = verdict(name)
    assert not {f.code for f in v.findings} & {"NET010", "NET011", "NET012", "NET014"}


# ---------------------------------------------------------------------------------------------
# GPUDirect RDMA and the lines that are data without a transport


def test_gdr_disabled_lines_are_read_and_judged():
    text = (FIXTURES / "field" / "nccl-gdr-disabled-after-dgx-os-upgrade" / "nccl.log").read_text()
    signals = collect_nccl_log(text, "nccl.log")
    # four lines, three distinct HCAs: mlx5_0 (twice), mlx5_1, mlx5_2
    gdr = signals.signals["nccl_gdr_disabled_nics"]
    assert gdr.stat("value") == 3 and set(gdr.by_series) == {"mlx5_0", "mlx5_1", "mlx5_2"}
    assert finding(build_verdict(signals), "NET015").category is Category.network


def test_gdr_does_not_matter_where_every_connection_stays_in_one_host():
    line = "h:1:2 [0] NCCL INFO NET/IB : GPU Direct RDMA Disabled for HCA 0 'mlx5_0'\n"
    p2p = "h:1:2 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM\n"
    assert collect_nccl_log(line, "x").signals["nccl_gdr_disabled_nics"].stat("value") == 1
    assert collect_nccl_log(line + p2p, "x").signals["nccl_gdr_disabled_nics"].unavailable
    # sockets never have GDR: their line is no RDMA NIC
    socket = "h:1:2 [0] NCCL INFO NET/Socket : GPU Direct RDMA Disabled for HCA 0 'eth0'\n" + p2p
    assert "eth0" not in collect_nccl_log(socket, "x").sources[0].config.get("gpudirect_rdma", "")


def test_nic_and_setting_lines_are_data():
    text = (FIXTURES / "field" / "mixed-nccl-tests-p2p-level-loc-forces-shm" / "nccl.log").read_text()
    signals = collect_nccl_log(text, "nccl.log")
    config = signals.sources[0].config
    assert config["nics"] == "mlx5_0:1 (IB), mlx5_2:1 (IB)"
    assert "NCCL_IB_DISABLE=0" in config["env"]


def test_number_free_nccl_lines_inside_another_kind_of_file_do_not_refuse_it(tmp_path):
    # plugin-loading lines alone are refused; beside a vLLM log's lines the file is the log, and they add no source
    from llmdiag.collect.evidence import collect_evidence, sort_files

    plugins = (NCCL / "plugins-only.txt").read_text()
    server = (FIXTURES / "logs" / "vllm-0.32-healthy.log").read_text()
    mixed = tmp_path / "mixed.log"
    mixed.write_text(server + plugins)
    assert set(sort_files([mixed]).files) == {"log"}
    assert [s.probe for s in collect_evidence([mixed]).sources] == ["vllm-log"]
    with pytest.raises(InputFileError, match="no numbers"):
        collect_nccl_log(plugins, "plugins.log")
