"""The bundle file (llmdiag.collect.bundle) and the tape (llmdiag.collect.tape): written and read back, secrets
scrubbed, and a hostile file refused at the reader (traversal, links, devices, caps, a gzip bomb), never extracted or
run."""

from __future__ import annotations

import gzip
import io
import json
import math
import tarfile
from pathlib import Path

import pytest

from llmdiag.collect import bundle as bundle_module
from llmdiag.collect.bundle import Bundle, Run, is_bundle, read_bundle, read_members, scrub, write_bundle
from llmdiag.collect.exposition import Scrape
from llmdiag.collect.tape import Tape, error_from_json, error_to_json, scrape_from_json, scrape_to_json, using
from llmdiag.errors import HTTPStatusError, InputFileError, ProbeError, UsageError


def small_bundle(**call: object) -> Bundle:
    tape = Tape()
    tape.put("page http://h:1/metrics", {"value": {"text": "a 1\n", "read_at_unix": 100.0}, "at_unix": 100.0})
    tape.put("page http://h:1/metrics", {"value": {"text": "a 2\n", "read_at_unix": 101.5}, "at_unix": 101.5})
    return Bundle(
        "scan", {"url": "http://h:1"}, [Run("http://h:1", {"kind": "diagnose", **call}, tape.to_json(), "{}")]
    )


def test_a_written_bundle_reads_back_with_its_reads_summarised(tmp_path: Path) -> None:
    path = tmp_path / "b.tar.gz"
    size = write_bundle(path, small_bundle(duration_seconds=3))
    assert size == path.stat().st_size and is_bundle(path)
    back = read_bundle(path)
    assert back.command == "scan" and back.options == {"url": "http://h:1"}
    assert back.runs[0].call["duration_seconds"] == 3
    assert back.runs[0].tape["channels"]["page http://h:1/metrics"][1]["value"]["text"] == "a 2\n"
    manifest = json.loads(read_members(path)["manifest.json"])
    assert manifest["format"] == "llmdiag-bundle" and manifest["format_version"] == 1
    # per channel: the reads and when the first and last were made (the numbers put on the tape above)
    assert manifest["runs"][0]["reads"]["page http://h:1/metrics"] == {
        "reads": 2,
        "first_unix": 100.0,
        "last_unix": 101.5,
    }


def test_secrets_are_scrubbed_from_every_member_raw_and_as_json_escapes(tmp_path: Path) -> None:
    secret = 'sk-"quoted"-123'
    bundle = small_bundle(note=f"echoed {secret}")
    bundle.runs[0].tape["channels"]["page http://h:1/metrics"][0]["value"]["text"] = f"# {secret}\na 1\n"
    path = tmp_path / "b.tar.gz"
    write_bundle(path, bundle, secrets=[secret, "ab"])
    raw = gzip.decompress(path.read_bytes())
    assert b"sk-" not in raw and b"quoted" not in raw
    assert b"***" in raw
    # too short to scrub without corrupting the pages (never written as an option either)
    assert scrub("a tab", ["ab"]) == "a tab"


def test_a_file_that_is_not_a_bundle_is_not_taken_for_one(tmp_path: Path) -> None:
    page = tmp_path / "metrics.prom"
    page.write_text("vllm:num_requests_running 1\n")
    gz = tmp_path / "trace.json.gz"
    gz.write_bytes(gzip.compress(b'{"traceEvents": []}'))
    assert not is_bundle(page) and not is_bundle(gz) and not is_bundle(tmp_path / "missing.tar.gz")


def tar_gz(path: Path, members: list[tarfile.TarInfo], data: dict[str, bytes] | None = None) -> Path:
    data = data or {}
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for info in members:
            body = data.get(info.name)
            if body is not None:
                info.size = len(body)
            tar.addfile(info, io.BytesIO(body) if body is not None else None)
    path.write_bytes(gzip.compress(buffer.getvalue()))
    return path


def member(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, link
    return info


MANIFEST = json.dumps({"format": "llmdiag-bundle", "format_version": 1, "runs": []}).encode()


@pytest.mark.parametrize(
    ("bad", "said"),
    [
        (member("../../etc/cron.d/x"), "points outside the bundle"),
        (member("/etc/passwd"), "points outside the bundle"),
        (member("runs/0/../../x.json"), "points outside the bundle"),
        (member("runs/0/tape.json", tarfile.SYMTYPE, "/etc/shadow"), "is a link"),
        (member("runs/0/tape.json", tarfile.LNKTYPE, "manifest.json"), "is a link"),
        (member("runs/0/tape.json", tarfile.CHRTYPE), "not a regular file"),
        (member("runs/0/tape.json", tarfile.FIFOTYPE), "not a regular file"),
        (member("run.sh"), "not part of a bundle"),
    ],
)
def test_a_hostile_member_is_refused_by_name(tmp_path: Path, bad: tarfile.TarInfo, said: str) -> None:
    path = tar_gz(tmp_path / "b.tar.gz", [member("manifest.json"), bad], {"manifest.json": MANIFEST, bad.name: b"{}"})
    with pytest.raises(InputFileError, match=said):
        read_bundle(path)
    assert not (tmp_path / "etc").exists()


def test_a_member_twice_is_refused(tmp_path: Path) -> None:
    path = tar_gz(
        tmp_path / "b.tar.gz",
        [member("manifest.json"), member("manifest.json")],
        {"manifest.json": MANIFEST},
    )
    with pytest.raises(InputFileError, match="appears twice"):
        read_bundle(path)


def test_a_gzip_bomb_stops_at_the_decompression_cap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # 64 MiB of zeros inside a regular member: about 64 KiB compressed; the cap (lowered to keep the test fast)
    # stops the reader long before it is all in memory
    zeros = b"\0" * (64 * 2**20)
    path = tar_gz(tmp_path / "bomb.tar.gz", [member("manifest.json"), member("runs/0/tape.json")],
                  {"manifest.json": MANIFEST, "runs/0/tape.json": zeros})  # fmt: skip
    assert path.stat().st_size < 2**20
    with pytest.raises(InputFileError, match="decompresses to more than 8 MiB"):
        read_members(path, max_total_bytes=8 * 2**20)


def test_a_member_over_its_cap_is_refused_before_it_is_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bundle_module, "MAX_MEMBER_BYTES", 1000)
    path = tar_gz(
        tmp_path / "b.tar.gz",
        [member("manifest.json"), member("runs/0/tape.json")],
        {"manifest.json": MANIFEST, "runs/0/tape.json": b" " * 5000},
    )
    with pytest.raises(InputFileError, match="over the member cap"):
        read_members(path)


def test_the_compressed_file_is_capped_before_it_is_opened(tmp_path: Path) -> None:
    path = tmp_path / "big.tar.gz"
    path.write_bytes(b"\x1f\x8b" + b"x" * 3 * 2**20)
    with pytest.raises(InputFileError, match="over the 2 MiB bundle cap"):
        read_members(path, max_file_bytes=2 * 2**20)


@pytest.mark.parametrize(
    ("manifest", "said"),
    [
        (b"not json", "manifest.json is not JSON"),
        (json.dumps({"format": "something-else"}).encode(), "does not say format"),
        (
            json.dumps({"format": "llmdiag-bundle", "format_version": 99, "llmdiag_version": "9.9"}).encode(),
            "format 99",
        ),
        (MANIFEST, "lists no runs"),
    ],
)
def test_a_manifest_that_is_wrong_is_one_clear_error(tmp_path: Path, manifest: bytes, said: str) -> None:
    path = tar_gz(tmp_path / "b.tar.gz", [member("manifest.json")], {"manifest.json": manifest})
    with pytest.raises(InputFileError, match=said):
        read_bundle(path)


def test_truncated_gzip_is_one_clear_error(tmp_path: Path) -> None:
    good = tmp_path / "good.tar.gz"
    write_bundle(good, small_bundle())
    cut = tmp_path / "cut.tar.gz"
    cut.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    with pytest.raises(InputFileError, match="not a readable bundle"):
        read_bundle(cut)


# --- the tape ------------------------------------------------------------------------------------------------------


def test_a_replay_that_asks_for_more_than_was_recorded_says_so() -> None:
    tape = Tape.from_json({"channels": {"canary": []}, "clock": [1.0]})
    clock = tape.clock(lambda: 0.0)
    assert clock() == 1.0
    with pytest.raises(InputFileError, match="read the window's clock more often"):
        clock()
    with pytest.raises(InputFileError, match=r"read 1 of canary, and the bundle holds 0"):
        tape.take("canary")


def test_a_recorded_probe_error_is_raised_again_as_its_class_with_its_words() -> None:
    recording = Tape()
    with pytest.raises(HTTPStatusError):
        recording.answer("page u", lambda: (_ for _ in ()).throw(HTTPStatusError("http://u/metrics", 503)), str, str)
    replay = Tape.from_json(json.loads(json.dumps(recording.to_json())))
    with using(replay), pytest.raises(HTTPStatusError) as raised:
        replay.answer("page u", lambda: pytest.fail("replay reached the live read"), str, str)
    assert raised.value.status == 503 and "answered HTTP 503" in raised.value.message
    # a class name that is not a ProbeError of llmdiag.errors is never looked up further
    forged = error_from_json({"class": "SystemExit", "message": "m"})
    assert type(forged) is ProbeError
    assert error_to_json(forged)["class"] == "ProbeError"


def test_a_scrape_survives_json_with_its_labels_nan_and_unavailable_reasons() -> None:
    scrape = Scrape(at_unix=12.5, size_bytes=7)
    scrape.series["nvml_gpu_utilization_ratio"] = {(("gpu", "0"),): 0.97, (("gpu", "1"),): math.nan}
    scrape.series["nvml_power_watts"] = {(): math.inf}
    scrape.unavailable["nvml_xid_errors_total"] = "GPU 0: not supported"
    back = scrape_from_json(json.loads(json.dumps(scrape_to_json(scrape), allow_nan=False)))
    assert back.at_unix == 12.5 and back.size_bytes == 7
    assert back.series["nvml_gpu_utilization_ratio"][(("gpu", "0"),)] == 0.97
    assert math.isnan(back.series["nvml_gpu_utilization_ratio"][(("gpu", "1"),)])
    assert back.series["nvml_power_watts"][()] == math.inf
    assert back.unavailable == scrape.unavailable


def test_a_tar_that_is_not_a_bundle_is_routed_to_the_reader_and_said_so(tmp_path: Path) -> None:
    path = tar_gz(tmp_path / "logs.tar.gz", [member("vllm.log")], {"vllm.log": b"INFO 12-01 engine started\n"})
    assert is_bundle(path)
    with pytest.raises(InputFileError, match="not part of a bundle"):
        read_bundle(path)


def test_a_recording_the_reader_would_refuse_is_not_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bundle_module, "MAX_MEMBER_BYTES", 100)
    path = tmp_path / "big.tar.gz"
    with pytest.raises(UsageError, match="over what a bundle may hold"):
        write_bundle(path, small_bundle())
    assert not path.exists() and not list(tmp_path.iterdir())
