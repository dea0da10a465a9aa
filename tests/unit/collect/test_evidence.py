"""Each file told apart by what it holds, and an incident's files read together (llmdiag.collect.evidence)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from llmdiag.collect.evidence import KINDS, ReadOptions, classify, collect_evidence, each, read_head, sort_files
from llmdiag.collect.exposition import parse_pasted
from llmdiag.collect.files import collect_files
from llmdiag.collect.signals import build_signal_set
from llmdiag.errors import InputFileError, UsageError
from llmdiag.schema.loader import load_probe
from tests.conftest import FIXTURES

MEMORY = FIXTURES / "vllm-0.32.0" / "memory"
DCGM = FIXTURES / "dcgm" / "a800-8gpu-mig-idle.prom"
LOG = FIXTURES / "logs" / "vllm-0.32-kv-starved.log"
TRT = FIXTURES / "trtllm" / "iteration-stats-executor-long-prompt.json"
SMI = FIXTURES / "nvidia-smi"
MIB = 1024 * 1024


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def paste(path: Path, source: Path, quote: str = "> ") -> Path:
    """A real file quoted into a bug report: a header, a fence, every line quoted, a closing remark."""
    body = "\n".join(f"{quote}{line}" for line in source.read_text().splitlines())
    return write(path, f"Posted by a user:\n\n{quote}```\n{body}\n{quote}```\n\nAny idea why it stalls?\n")


@pytest.mark.parametrize(
    ("source", "kind", "words"),
    [
        (MEMORY / "scrape-06.prom", "dump", "server /metrics dump"),
        (FIXTURES / "sglang" / "dp2-imbalanced-1.prom", "dump", "server /metrics dump"),
        (FIXTURES / "tgi" / "budget-full-1.prom", "dump", "server /metrics dump"),
        (FIXTURES / "llamacpp" / "slots-full-1.prom", "dump", "server /metrics dump"),
        (DCGM, "dcgm", "DCGM exporter page"),
        (TRT, "dump", "TensorRT-LLM JSON iteration stats"),
        (SMI / "h100-sxm-x8-idle-table.txt", "nvidia-smi", "nvidia-smi output"),
        (SMI / "h200-idle-q.txt", "nvidia-smi", "nvidia-smi output"),
        (SMI / "rtx3090-x4-q-x.xml", "nvidia-smi", "nvidia-smi output"),
    ],
)
def test_a_pasted_file_is_told_by_what_it_holds(tmp_path, source, kind, words):
    for quote in ("", "> "):
        found = classify(read_head(paste(tmp_path / "report.md", source, quote)))
        assert (found.name, found.words) == (kind, words), quote


def test_a_log_is_a_log_and_every_kind_has_a_reader(tmp_path):
    assert classify(read_head(LOG)).name == "log"
    # TensorRT-LLM's own log: bracketed tags, then its iteration records one a line (not a JSON array)
    records = (FIXTURES / "logs" / "trtllm-iterations.log").read_text()
    trt_log = write(
        tmp_path / "trt.log", "[TensorRT-LLM][INFO] Engine version 1.0.0rc4 found in the config file\n" + records
    )
    assert classify(read_head(trt_log)).name == "log"
    assert all(callable(k.test) and callable(k.read) for k in KINDS)


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("", "is empty"),
        ("We upgraded and now it is slow. Any idea?\nThanks\n", "holds no metric or log lines (it starts: We upgraded"),
        ("```\n```\n> ```\n> ```\n", "holds no metric or log lines (only Markdown fences and quote marks)"),
    ],
)
def test_files_without_data_are_refused(tmp_path, text, said):
    with pytest.raises(InputFileError, match=r"holds no|is empty") as caught:
        classify(read_head(write(tmp_path / "x.md", text)))
    assert said in caught.value.message and caught.value.hint


def test_binary_and_directory_are_refused(tmp_path):
    binary = tmp_path / "x.bin"
    binary.write_bytes(b"\x7fELF\x02\x01\x01\0\0\0vllm:num_requests_running 3\n")
    with pytest.raises(InputFileError, match="binary file"):
        read_head(binary)
    with pytest.raises(InputFileError, match="is a directory"):
        read_head(tmp_path)


def test_a_log_a_dump_and_a_dcgm_page_are_read_together(tmp_path):
    dump = paste(tmp_path / "metrics.md", MEMORY / "scrape-06.prom")
    signals = collect_evidence([LOG, dump, DCGM])
    probes = [s.probe for s in signals.sources]
    assert probes == ["vllm-log", "vllm", "dcgm"]  # the log gives the window, then the dump, then the GPUs
    assert signals.window.note.startswith("from ")  # the log's window
    # the log has no latency histograms: the pasted dump's TTFT fills in, and its coverage line says so
    assert signals.get("ttft_seconds").source.startswith("vllm /metrics")
    log_note, dump_note, gpu_note = (s.note for s in signals.sources)
    assert "gave " in log_note and "ttft_seconds" not in log_note and "gpu_" not in log_note
    assert "gave " in dump_note and "requests_waiting" not in dump_note
    # the A800 page: the hottest GPU reads 33 C, the idle ones clock at 210 MHz (gpu 0's MIG instances at 1410)
    assert signals.get("gpu_temperature_celsius").stats["last"] == pytest.approx(33.0)
    assert signals.get("sm_clock_hertz").stats["last"] == pytest.approx(210e6)
    assert gpu_note.startswith("gave ") and "gpu_temperature_celsius" in gpu_note
    # the log's own queue is what the verdict reads (the first source of a signal wins)
    assert signals.get("requests_waiting").source.startswith("vLLM log")


def test_since_applies_to_the_logs_only(tmp_path):
    dump = MEMORY / "scrape-06.prom"
    whole = collect_evidence([LOG, dump])
    cut = collect_evidence([LOG, dump], ReadOptions(since="15s"))  # the last 15 s of the log
    assert cut.window.duration_seconds < whole.window.duration_seconds
    # the dump is taken whole either way: its lifetime TTFT count is the same
    assert cut.get("ttft_seconds").stats["count"] == whole.get("ttft_seconds").stats["count"]
    with pytest.raises(UsageError, match="apply to server logs"):
        collect_evidence([dump], ReadOptions(since="10m"))


def test_a_dcgm_page_alone_is_judged_with_the_server_unknown():
    signals = collect_evidence([DCGM])
    assert signals.window.kind == "snapshot"
    assert signals.get("sm_clock_hertz").stats["last"] == pytest.approx(210e6)  # the slowest GPU's clock in the page
    running = signals.get("requests_running")
    assert running.unavailable and "no server page or log given" in running.unavailable and not running.stats


def test_server_names_the_probe_for_dumps(tmp_path):
    pages = sorted((FIXTURES / "tgi").glob("*.prom"))
    signals = collect_evidence(pages, ReadOptions(server="tgi"))
    assert "tgi given" in signals.sources[0].note
    with pytest.raises(InputFileError, match="none from SGLang"):
        collect_evidence(pages, ReadOptions(server="sglang"))


def test_server_applies_to_logs_too():
    with pytest.raises(InputFileError):
        collect_evidence([LOG], ReadOptions(server="sglang"))  # a vLLM log read as SGLang's has no stat lines
    assert collect_evidence([LOG], ReadOptions(server="vllm")).sources[0].probe == "vllm-log"


def test_trtllm_json_pasted_in_a_fence(tmp_path):
    records = json.loads(TRT.read_text())
    report = write(tmp_path / "issue.md", "Stats from /metrics:\n```json\n" + json.dumps(records, indent=1) + "\n```\n")
    pasted = collect_evidence([report])
    direct = collect_files([TRT], probe="trtllm")
    assert pasted.get("requests_waiting").stats == direct.get("requests_waiting").stats
    assert os.fspath(report) in pasted.sources[0].url


def test_a_one_file_at_a_time_reader_merges_in_file_order():
    """``each``: how a reader of single texts (nvidia-smi, NCCL logs) joins the table; here a real DCGM page's."""

    def one_page(text: str, origin: str):
        return build_signal_set(load_probe("dcgm"), [parse_pasted(text, None, origin)], origin)

    quickstart = FIXTURES / "dcgm" / "readme-quickstart.prom"
    signals = each(one_page)([quickstart, DCGM], ReadOptions())
    assert [s.url for s in signals.sources] == [str(quickstart), str(DCGM)]
    # the quickstart page's single GPU clocks at 139 MHz: the first page's signal wins
    assert signals.get("sm_clock_hertz").stats["last"] == pytest.approx(139e6)


def test_nvidia_smi_beside_a_dump_gives_the_gpu_signals(tmp_path):
    """A bug report's two pastes: the server's page and nvidia-smi's table, read as one incident."""
    table = paste(tmp_path / "smi.md", SMI / "rtx4090-x4-shared-gpu-table.txt")
    signals = collect_evidence([MEMORY / "scrape-06.prom", table])
    assert signals.signals["requests_running"].unavailable is None  # from the dump
    used = signals.signals["gpu_memory_used_bytes"]
    assert used.unavailable is None and used.stats["max"] == 23703 * MIB  # the table's fullest GPU
    assert [s.probe for s in signals.sources] == ["vllm", "nvidia-smi"]


@pytest.mark.parametrize("name", ["watchdog-timeout-allreduce.txt", "ring-p2p-ipc-interleaved.txt"])
def test_an_nccl_log_alone_is_an_nccl_log(name):
    assert classify(read_head(FIXTURES / "nccl" / name)).name == "nccl-log"


def test_nccl_lines_inside_a_server_log_are_read_as_well(tmp_path):
    """A vLLM log whose tensor-parallel workers hit the NCCL watchdog: the stat lines and the timeout, one incident."""
    watchdog = (FIXTURES / "nccl" / "watchdog-timeout-allreduce.txt").read_text()
    both = write(tmp_path / "server.log", LOG.read_text() + watchdog)
    evidence = sort_files([both])
    assert set(evidence.files) == {"log", "nccl-log"}
    signals = collect_evidence([both], evidence=evidence)
    assert signals.signals["requests_running"].unavailable is None
    assert signals.signals["collective_timeouts"].stats["value"] == watchdog.count("Watchdog caught collective")


def test_a_comment_with_a_log_and_an_nvidia_smi_table_is_read_by_both(tmp_path):
    """One pasted comment: the server's stat lines, then nvidia-smi's table below them."""
    table = (SMI / "rtx4090-x4-shared-gpu-table.txt").read_text()
    comment = write(tmp_path / "comment.md", f"Server log:\n```\n{LOG.read_text()}```\nnvidia-smi:\n```\n{table}```\n")
    evidence = sort_files([comment])
    assert set(evidence.files) == {"log", "nvidia-smi"}
    signals = collect_evidence([comment], evidence=evidence)
    assert signals.signals["requests_running"].unavailable is None
    assert signals.signals["gpu_memory_used_bytes"].stats["max"] == 23703 * MIB
