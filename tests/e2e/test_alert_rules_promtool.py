"""`llmdiag rules export --server vllm` under Prometheus's own unit tester (`promtool test rules`, Debian's), fed
with the recorded real vLLM 0.32.0 states of tests/fixtures/vllm-0.32.0 (six scrapes 2 s apart each).

How the ~10 s recordings cover the rules' 5 m window and 2 m ``for:`` (tests/support/promtool_series.py):
every counter and every histogram/summary part (``_bucket``, ``_sum``, ``_count``) becomes ``a+bxN``: it starts at
its first scraped value and rises at the rate measured between the first and the last scrape; every gauge replays
its six recorded values in order, one per 15 s step, over and over. So each ``rate``/``increase`` reads the measured
rate, each ratio of counters (preemptions per finished request, Little's-law averages from ``_sum`` rates) and each
``histogram_quantile`` over bucket rates reads what the recording measured, and ``avg/max/min_over_time`` of a gauge
read the recorded mean, peak and floor: the state's physics stays as measured, only held for longer. The series carry
the ``job``/``instance`` labels a scrape would attach. The rules are evaluated every 30 s, from 0 to 10 m (window
5 m + ``for:`` 2 m + 3 m margin); the series cover 12 m.

Expected alerts (issue 20): MEM001 on ``memory`` (the KV-starved server), SCH001 on ``scheduling`` (``--max-num-seqs
2``) and on ``scheduling-starved`` (the same server recorded while its gauges were sampled at idle moments: the alert
reads the queue from the ``_sum`` rates, as the scan does), SCH004 on ``admission`` (``--max-num-queued-reqs 8``:
503s), CMP002 on ``compute`` (prefill dominates TTFT: analyze's primary finding there; CMP008, the step-time wall,
needs the physics tables and a fit that the export lists as not expressible in PromQL), and none at all on
``healthy`` and ``idle``. The expected code of each state must also be the primary finding of ``llmdiag analyze`` of
the same six scrapes, so the alert and the scan agree: the same severity, the alert's value (in its summary) the
value analyze measured for the rule's severity signal, and every alert that fires a finding analyze lists (advisory
where the finding is). An export with a ``--selector`` for another job fires nothing on the same series.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import pytest
import yaml

from llmdiag.schema.base import tomllib
from tests.conftest import REPO_ROOT, run_cli
from tests.support import promtool_series

FIXTURES = REPO_ROOT / "tests" / "fixtures" / "vllm-0.32.0"
WINDOW, FOR = "5m", "2m"
INTERVAL_S = 15.0
EVALUATION_INTERVAL = "30s"
EVAL_TIME_S = 600  # window 5 m + for 2 m + 3 m margin
SPAN_S = 720
TARGET = {"job": "vllm", "instance": "vllm-0:8000"}

# state -> the code whose alert must fire there (None: no alert at all)
EXPECTED: dict[str, str | None] = {
    "memory": "MEM001",
    "scheduling": "SCH001",
    "scheduling-starved": "SCH001",
    "admission": "SCH004",
    "compute": "CMP002",
    "healthy": None,
    "idle": None,
}


# ---------------------------------------------------------------------------------------------------- promtool


@dataclass(frozen=True)
class Alert:
    name: str
    labels: dict[str, str]
    annotations: dict[str, str]


@dataclass
class PromtoolRun:
    returncode: int
    output: str
    got: list[Alert] = field(default_factory=list)  # the alerts promtool said it got where a test case failed


_PAIR = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", '"': '"', "\\": "\\", "a": "\a", "b": "\b", "f": "\f", "v": "\v"}


def _go_unquote(text: str) -> str:
    """A Go ``strconv.Quote`` body (how promtool prints label and annotation values) back to its string."""
    out, i = [], 0
    while i < len(text):
        ch = text[i]
        if ch != "\\":
            out.append(ch)
            i += 1
            continue
        kind = text[i + 1]
        if kind in _ESCAPES:
            out.append(_ESCAPES[kind])
            i += 2
        else:  # \xHH, \uHHHH, \UHHHHHHHH
            width = {"x": 2, "u": 4, "U": 8}[kind]
            out.append(chr(int(text[i + 2 : i + 2 + width], 16)))
            i += 2 + width
    return "".join(out)


def _pairs(text: str) -> dict[str, str]:
    return {k: _go_unquote(v) for k, v in _PAIR.findall(text)}


def parse_got(output: str) -> list[Alert]:
    """The alerts in the ``got:[...]`` blocks of promtool's FAILED report."""
    alerts: list[Alert] = []
    name, in_got, labels = "", False, None
    for line in output.splitlines():
        stripped = line.strip()
        head = re.match(r"alertname: (\S+), time:", stripped)
        if head:
            name, in_got = head.group(1), False
        elif stripped.startswith("got:["):
            in_got = True
        elif in_got and stripped.startswith("Labels:{"):
            labels = _pairs(stripped[len("Labels:") :])
        elif in_got and stripped.startswith("Annotations:{") and labels is not None:
            alerts.append(Alert(name, labels, _pairs(stripped[len("Annotations:") :])))
            labels = None
        elif in_got and stripped.startswith("]"):
            in_got = False
    return alerts


def run_promtool(tmp: Path, rules: Path, test_cases: list[dict], series: list[dict[str, str]]) -> PromtoolRun:
    """``promtool test rules`` of one test group: ``series`` as input, ``test_cases`` as its alert_rule_test."""
    doc = {
        "rule_files": [str(rules)],
        "evaluation_interval": EVALUATION_INTERVAL,
        "tests": [{"interval": f"{int(INTERVAL_S)}s", "input_series": series, "alert_rule_test": test_cases}],
    }
    path = tmp / "promtool-test.yml"
    path.write_text(json.dumps(doc, indent=1))  # JSON is YAML
    done = subprocess.run(
        [promtool_series.BINARY, "test", "rules", str(path)], capture_output=True, text=True, timeout=120
    )
    output = done.stdout + done.stderr
    return PromtoolRun(done.returncode, output, parse_got(output))


# ---------------------------------------------------------------------------------------------------- the export


@dataclass(frozen=True)
class AlertRule:
    name: str
    code: str
    severity: str
    category: str


def alert_rules(rules_text: str) -> list[AlertRule]:
    """Every alerting rule of the export, with its code, severity and class labels."""
    doc = yaml.safe_load(rules_text)
    return [
        AlertRule(rule["alert"], rule["labels"]["code"], rule["labels"]["severity"], rule["labels"]["class"])
        for group in doc["groups"]
        for rule in group["rules"]
        if "alert" in rule
    ]


@pytest.fixture(scope="module")
def export(tmp_path_factory) -> tuple[Path, list[AlertRule]]:
    promtool_series.require()
    out = tmp_path_factory.mktemp("export") / "llmdiag-rules.yml"
    # the default window/for spelled out, so the evaluation time below is tied to them
    result = run_cli("rules", "export", "--server", "vllm", "--window", WINDOW, "--for", FOR, "-o", str(out))
    assert result.returncode == 0, result.stderr
    check = subprocess.run([promtool_series.BINARY, "check", "rules", str(out)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    return out, alert_rules(out.read_text())


# ---------------------------------------------------------------------------------------------------- analyze


def primary(verdict: dict) -> dict | None:
    """analyze's primary finding: its first finding of a bottleneck class (sanity findings are not a class)."""
    classed = [f for f in verdict["findings"] if f["category"] != "sanity"]
    return classed[0] if classed else None


@cache
def analyze(state: str) -> dict:
    scrapes = sorted(str(p) for p in (FIXTURES / state).glob("scrape-*.prom"))
    result = run_cli("analyze", "--json", *scrapes)
    assert result.returncode in (0, 1), result.stderr
    return json.loads(result.stdout)


# ---------------------------------------------------------------------------------------------------- the series


def raw(state: str, sample: str) -> tuple[list[float], list[float]]:
    """The scrape times and the values of one sample line (name and labels as printed) in a state's files, read with
    a plain regex, apart from the converter's parser."""
    times, values = [], []
    for path in sorted((FIXTURES / state).glob("scrape-*.prom")):
        text = path.read_text()
        times.append(float(text.split("\n", 1)[0].split(":", 1)[1]))
        found = re.search(rf"^{re.escape(sample)} (\S+)$", text, re.M)
        assert found, f"{sample} not in {path}"
        values.append(float(found.group(1)))
    return times, values


def test_extended_series_keep_the_recorded_rates_and_levels(tmp_path) -> None:
    """PromQL over the extended series of the KV-starved state reads what the six scrapes say: the preemption rate
    (16 preemptions in ~10 s), the mean of the waiting gauge over one replay of its six values, the KV peak, the mean
    TTFT from the _sum/_count rates, and a TTFT p50 from the bucket rates inside the bucket the raw increase puts it."""
    promtool_series.require()
    engine = '{engine="0",model_name="tiny-llama"}'
    t, preempted = raw("memory", f"vllm:num_preemptions_total{engine}")
    _, waiting = raw("memory", f"vllm:num_requests_waiting{engine}")
    _, kv = raw("memory", f"vllm:kv_cache_usage_perc{engine}")
    _, ttft_sum = raw("memory", f"vllm:time_to_first_token_seconds_sum{engine}")
    _, ttft_count = raw("memory", f"vllm:time_to_first_token_seconds_count{engine}")
    assert preempted[-1] - preempted[0] == 16  # the README's "preemptions Δ 16"
    checks = {
        "rate(vllm:num_preemptions_total[5m])": (preempted[-1] - preempted[0]) / (t[-1] - t[0]),
        # [75s] holds 6 samples 15 s apart (both ends included): one replay of the six recorded values
        "avg_over_time(vllm:num_requests_waiting[75s])": sum(waiting) / len(waiting),
        "max_over_time(vllm:kv_cache_usage_perc[5m])": max(kv),
        "rate(vllm:time_to_first_token_seconds_sum[5m]) / rate(vllm:time_to_first_token_seconds_count[5m])": (
            (ttft_sum[-1] - ttft_sum[0]) / (ttft_count[-1] - ttft_count[0])
        ),
    }
    labels = f'{{engine="0", instance="{TARGET["instance"]}", job="vllm", model_name="tiny-llama"}}'
    cases = [
        {
            "expr": f"abs(({expr}) - {expected!r}) <= bool {abs(expected) * 1e-9 + 1e-12!r}",
            "eval_time": f"{EVAL_TIME_S}s",
            "exp_samples": [{"labels": labels, "value": 1}],
        }
        for expr, expected in checks.items()
    ]
    # the TTFT p50 lies in the bucket where the raw bucket increases cross half the requests
    bounds = re.findall(r'^vllm:time_to_first_token_seconds_bucket\{engine="0",le="([^"]+)"', _scrape_text(), re.M)
    increases = [_bucket_increase(le) for le in bounds]
    half = (ttft_count[-1] - ttft_count[0]) / 2
    upper_index = next(i for i, n in enumerate(increases) if n >= half)
    lower = float(bounds[upper_index - 1]) if upper_index else 0.0
    quantile = "histogram_quantile(0.5, rate(vllm:time_to_first_token_seconds_bucket[5m]))"
    cases.append(
        {
            "expr": f"({quantile} > bool {lower!r}) * ({quantile} <= bool {float(bounds[upper_index])!r})",
            "eval_time": f"{EVAL_TIME_S}s",
            "exp_samples": [{"labels": labels, "value": 1}],
        }
    )
    series = promtool_series.input_series(promtool_series.read_state(FIXTURES / "memory"), INTERVAL_S, SPAN_S, TARGET)
    doc = {"tests": [{"interval": f"{int(INTERVAL_S)}s", "input_series": series, "promql_expr_test": cases}]}
    path = tmp_path / "series-test.yml"
    path.write_text(json.dumps(doc, indent=1))
    done = subprocess.run([promtool_series.BINARY, "test", "rules", str(path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def _scrape_text(state: str = "memory", n: int = 1) -> str:
    return (FIXTURES / state / f"scrape-{n:02d}.prom").read_text()


def _bucket_increase(le: str) -> float:
    name = f'vllm:time_to_first_token_seconds_bucket{{engine="0",le="{le}",model_name="tiny-llama"}}'
    _, values = raw("memory", name)
    return values[-1] - values[0]


# ---------------------------------------------------------------------------------------------------- the alerts


@pytest.fixture(scope="module")
def probe(export, tmp_path_factory):
    """``probe(state)``: promtool run over the state's series, expecting no alert of any name at the evaluation time,
    so its report lists every alert that fires there (cached per state)."""
    rules, alerts = export
    runs: dict[str, PromtoolRun] = {}

    def run(state: str) -> PromtoolRun:
        if state not in runs:
            names = sorted({a.name for a in alerts})
            cases = [{"eval_time": f"{EVAL_TIME_S}s", "alertname": name, "exp_alerts": []} for name in names]
            runs[state] = run_promtool(tmp_path_factory.mktemp(state), rules, cases, series(state))
        return runs[state]

    return run


@cache
def series(state: str) -> list[dict[str, str]]:
    return promtool_series.input_series(promtool_series.read_state(FIXTURES / state), INTERVAL_S, SPAN_S, TARGET)


def rule_file(code: str) -> Path:
    (path,) = (REPO_ROOT / "rules").glob(f"*/{code}-*.toml")
    return path


def firing(run: PromtoolRun) -> list[str]:
    return sorted(f"{a.labels.get('code')} {a.labels.get('severity')}" for a in run.got)


@pytest.mark.parametrize("state", [s for s, code in EXPECTED.items() if code is not None])
def test_the_states_alert_fires_with_its_labels_and_annotations(state, export, probe, tmp_path) -> None:
    code = EXPECTED[state]
    rules, alerts = export
    finding = primary(analyze(state))
    assert finding is not None and finding["code"] == code, f"analyze's primary of {state}: {finding}"
    run = probe(state)
    # the expectation of no alert fails on this state: promtool can fail on these files
    assert run.returncode != 0 and "FAILED" in run.output, run.output
    got = [a for a in run.got if a.labels.get("code") == code]
    assert len(got) == 1, f"{code} alerts firing on {state}: {got}; all firing: {firing(run)}"
    (alert,) = got
    names = {a.name for a in alerts if a.code == code}
    assert alert.name in names
    expected_labels = {
        "code": code,
        "severity": finding["severity"],
        "class": finding["category"],
        "llmdiag_server": "vllm",
        **TARGET,
    }
    assert alert.labels == {"alertname": alert.name, **expected_labels}
    # annotations: filled, their numbers rendered, the fix from the rule's vLLM fixes, the runbook its docs page
    rule = tomllib.loads(rule_file(code).read_text())
    notes = alert.annotations
    assert "<no value>" not in notes["summary"], notes
    # the summary's {{ $value }}: the rule's severity signal, as analyze measured it on the same scrapes (2%: a 5 m
    # window holds 21 gauge samples, three replays and three more values; and printf "%.4g")
    ladder = f"{rule['severity']['signal']}.{rule['severity']['stat']}"
    shown = re.search(re.escape(ladder) + r" = ([-+0-9.eE]+)", notes["summary"])
    assert shown, notes["summary"]
    (measured,) = [
        e["value"]
        for e in finding["evidence"]
        if (e["signal"], e["stat"]) == (rule["severity"]["signal"], rule["severity"]["stat"])
    ]
    assert math.isclose(float(shown.group(1)), measured, rel_tol=0.02), (notes["summary"], measured)
    assert not [v for v in notes.values() if "error expanding template" in v], notes
    assert rule["fix"]["vllm"][0] in notes["fix"], notes["fix"]
    page = f"docs/rules/{code}-{rule['slug']}.md"
    assert notes["runbook_url"].endswith(page) and (REPO_ROOT / page).is_file(), notes["runbook_url"]
    # now the exact expectation, annotations included, for every alert of the code: promtool passes
    cases = [
        {
            "eval_time": f"{EVAL_TIME_S}s",
            "alertname": name,
            "exp_alerts": (
                [{"exp_labels": expected_labels, "exp_annotations": alert.annotations}] if name == alert.name else []
            ),
        }
        for name in sorted(names)
    ]
    exact = run_promtool(tmp_path, rules, cases, series(state))
    assert exact.returncode == 0 and "SUCCESS" in exact.output, exact.output


@pytest.mark.parametrize("state", [s for s, code in EXPECTED.items() if code is None])
def test_no_alert_fires_on_a_quiet_state(state, probe) -> None:
    verdict = analyze(state)
    assert verdict["bottleneck"] == state and primary(verdict) is None, verdict["summary"]
    run = probe(state)
    assert run.returncode == 0 and "SUCCESS" in run.output, f"firing on {state}: {firing(run)}\n{run.output[-3000:]}"


def test_alerts_and_analyze_agree_on_every_recorded_state(probe) -> None:
    """The table of agreement: state → analyze's primary finding → the alerts firing at the evaluation time."""
    rows = []
    for state, code in EXPECTED.items():
        finding = primary(analyze(state))
        said = f"{finding['code']} {finding['severity']}" if finding else analyze(state)["bottleneck"]
        alerts = firing(probe(state))
        rows.append((state, code or "none", said, ", ".join(alerts) or "none"))
    widths = [max(len(r[i]) for r in [("state", "expected", "analyze", "alerts"), *rows]) for i in range(4)]
    lines = [("state", "expected", "analyze primary", "alerts firing"), *rows]
    print("\n" + "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in lines))
    for state, expected, said, alerts in rows:
        if expected == "none":
            assert alerts == "none", (state, alerts)
        else:
            assert said.split()[0] == expected and expected in alerts, (state, said, alerts)
        # every alert is a finding of the scan at its severity (the scan may list more: an alert whose cause fires
        # too is held back by the precedence guard, as SCH002 behind CMP002 on compute)
        findings = {f"{f['code']} {f['severity']}" for f in analyze(state)["findings"]}
        assert set(firing(probe(state))) <= findings, (state, alerts, findings)
        # an advisory finding (CMP001: the TPOT SLO, not a proven class) is an alert labelled advisory="true"
        advisory = {f["code"]: f["advisory"] for f in analyze(state)["findings"]}
        for alert in probe(state).got:
            code = alert.labels["code"]
            assert (alert.labels.get("advisory") == "true") == advisory[code], (state, alert.labels)


@pytest.mark.parametrize(("selector", "fires"), [('{job="vllm"}', True), ('{job="another-job"}', False)])
def test_the_selector_scopes_the_alerts(selector, fires, tmp_path) -> None:
    """The KV-starved state's MEM001 fires through an export whose --selector matches the scraped job, and nothing
    fires through one that names another job: every raw series the rules read carries the selector."""
    promtool_series.require()
    out = tmp_path / "llmdiag-rules.yml"
    result = run_cli("rules", "export", "--server", "vllm", "--selector", selector, "-o", str(out))
    assert result.returncode == 0, result.stderr
    names = sorted({a.name for a in alert_rules(out.read_text())})
    cases = [{"eval_time": f"{EVAL_TIME_S}s", "alertname": name, "exp_alerts": []} for name in names]
    run = run_promtool(tmp_path, out, cases, series("memory"))
    if fires:
        assert "MEM001 critical" in firing(run), run.output[-3000:]
    else:
        assert run.returncode == 0 and "SUCCESS" in run.output, firing(run)
