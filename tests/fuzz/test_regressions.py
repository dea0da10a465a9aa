"""Every crash the fuzzer found, kept as a fixture (tests/fuzz/regressions/, its README says what each was), run
through its target again: each now gives what a bad input should, an llmdiag error in plain words or a result."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import fuzz_inputs
from llmdiag.errors import ConfigError, LlmdiagError, NotMetricsError, TraceFileError

HERE = Path(__file__).parent / "regressions"
CASES = sorted(p for p in HERE.glob("*/*") if p.suffix in (".bin", ".json"))
# what each gives now, where it is one thing: the error class, or None for a result (an empty name: any llmdiag error)
EXPECTED: dict[str, type[LlmdiagError] | None] = {
    "analyze/log-hour-31.bin": None,
    "nccl-log/nvls-channels-past-a-float.bin": None,
    "nccl-tests/size-past-a-float.bin": None,
    "analyze/scraped-at-minus-1e309.bin": None,
    "config/readme-example-not-utf8.bin": ConfigError,
    "config/arrays-nested-too-deep.bin": ConfigError,
    "trtllm-json/iter-infinity.bin": NotMetricsError,
    "trtllm-json/iter-nan.bin": NotMetricsError,
    "trace/event-number-out-of-range.bin": TraceFileError,  # its end cut off too: truncated, said so
    "trace-gzip/event-number-out-of-range.bin": None,
    "trace/integer-beyond-a-float.bin": None,
    "trace/world-size-beyond-any-job.bin": None,
    "trace/top-value-nested-too-deep.bin": TraceFileError,
    "trace/event-nested-too-deep.bin": TraceFileError,
}


def _input(path: Path) -> object:
    if path.suffix == ".json":
        return [(status, body.encode("latin-1")) for status, body in json.loads(path.read_text(encoding="utf-8"))]
    return path.read_bytes()


def test_every_regression_is_listed_in_the_readme() -> None:
    readme = (HERE / "README.md").read_text(encoding="utf-8")
    assert CASES
    for path in CASES:
        assert f"`{path.name}`" in readme, path


@pytest.mark.parametrize("path", CASES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_a_crash_the_fuzzer_found_stays_fixed(path: Path, tmp_path: Path) -> None:
    _, call = fuzz_inputs.targets()[path.parent.name]
    key = f"{path.parent.name}/{path.name}"
    try:
        call(_input(path), tmp_path)  # type: ignore[operator]
    except LlmdiagError as exc:
        if key in EXPECTED:
            assert EXPECTED[key] is not None and isinstance(exc, EXPECTED[key]), exc  # type: ignore[arg-type]
        return
    assert EXPECTED.get(key) is None, f"{key} gave a result, expected {EXPECTED.get(key)}"


def test_the_trace_with_an_out_of_range_number_keeps_its_other_events(tmp_path: Path) -> None:
    """The args holding -1e309 (past a float) are read loosely; the events of the file are still read."""
    import io

    from llmdiag.collect.trace.analysis import classifier
    from llmdiag.collect.trace.reader import read_trace_stream

    data = (HERE / "trace" / "event-number-out-of-range.bin").read_bytes()
    whole = data[: data.rfind(b"},") + 1] + b"]}"  # the fuzzer also cut its end off: closed at its last event
    assert b"-1e309" in whole  # in an event's args: 'Ev Idx' and 'Input Dims'
    trace = read_trace_stream(io.BytesIO(whole), classifier().ops, "rank0.json")
    assert trace.events > whole.count(b'"ph"') // 2


def test_a_toml_that_is_not_utf8_names_the_byte(tmp_path: Path) -> None:
    from llmdiag.config import load_settings

    path = tmp_path / "llmdiag.toml"
    path.write_bytes((HERE / "config" / "readme-example-not-utf8.bin").read_bytes())
    with pytest.raises(ConfigError, match=r"not UTF-8 text \(byte 42\)"):
        load_settings(path)


def test_a_world_size_no_job_has_is_unknown_and_the_ranks_still_read() -> None:
    import io

    from llmdiag.collect.trace.analysis import classifier
    from llmdiag.collect.trace.reader import read_trace_stream

    data = (HERE / "trace" / "world-size-beyond-any-job.bin").read_bytes()
    assert b'"world_size": 99999999999999999999999999' in data
    trace = read_trace_stream(io.BytesIO(data), classifier().ops, "rank0.json")
    assert trace.world_size is None
    assert trace.rank == 1  # the file's own "rank": 1, as written


@pytest.mark.parametrize(
    ("command", "regression"),
    [
        ("trace", "trace/world-size-beyond-any-job.bin"),
        ("analyze", "trtllm-json/iter-nan.bin"),
        ("config", "config/readme-example-not-utf8.bin"),
    ],
)
def test_at_the_cli_a_regression_is_a_result_or_one_error_never_a_traceback(
    command: str, regression: str, tmp_path: Path
) -> None:
    """What the user sees for three of them: a verdict or one ERROR and one HINT line, no internal error."""
    from tests.conftest import run_cli

    data = (HERE / regression).read_bytes()
    page = str(fuzz_inputs.FIXTURES / "vllm-0.32.0" / "memory" / "scrape-01.prom")
    if command == "config":
        (tmp_path / "llmdiag.toml").write_bytes(data)
        result = run_cli("analyze", page, "--config", str(tmp_path / "llmdiag.toml"))
    else:
        path = tmp_path / ("rank0.json" if command == "trace" else "stats.json")
        path.write_bytes(data)
        result = run_cli(command, str(path))
    output = result.stdout + result.stderr
    assert "Traceback" not in output and "internal error" not in output, output[-2000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("ERROR:")]
    assert result.returncode in (0, 1) or (result.returncode == 2 and len(errors) == 1), output[-2000:]


def test_a_rule_spec_nested_past_the_stack_is_a_rule_spec_error() -> None:
    """parse_toml, which reads every rule and probe spec, refuses what load_settings refuses."""
    from llmdiag.errors import RuleSpecError
    from llmdiag.schema.base import parse_toml
    from llmdiag.schema.rules import RuleSpec

    text = (HERE / "config" / "arrays-nested-too-deep.bin").read_bytes().decode("utf-8", errors="replace")
    with pytest.raises(RuleSpecError, match="nested deeper than Python's stack"):
        parse_toml(RuleSpec, "rules/memory/MEM001-kv-cache-saturated.toml", text)
