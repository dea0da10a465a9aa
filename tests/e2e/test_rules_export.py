"""`llmdiag rules export` checked by Prometheus's own tool: `promtool check rules` on the file for every server
dialect, all of them together, and the PrometheusRule resource's groups.

promtool ships in Debian's ``prometheus`` package, which ``make test`` installs
(``python -m tests.support.prometheus_server install``) and then requires (LLMDIAG_PROMETHEUS_TESTS=1): a missing
promtool fails there instead of skipping.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from llmdiag.api.alerting import SERVERS
from tests.conftest import run_cli
from tests.support.prometheus_server import REQUIRED_ENV
from tests.support.required import require_tool


def promtool() -> str:
    found = shutil.which("promtool")
    require_tool(
        None if found else "promtool not on PATH (python -m tests.support.prometheus_server install)", REQUIRED_ENV
    )
    assert found is not None
    return found


def check_rules(path: Path) -> str:
    done = subprocess.run([promtool(), "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def passes_promtool_test(rules: Path, inputs: list[dict], expr_tests: list[dict], tmp_path: Path) -> None:
    """``promtool test rules`` passes on ``rules`` fed ``inputs`` (15 s apart, evaluated every 15 s): every
    ``promql_expr_test`` holds."""
    test = {
        "rule_files": [str(rules)],
        "evaluation_interval": "15s",
        "tests": [{"interval": "15s", "input_series": inputs, "promql_expr_test": expr_tests}],
    }
    spec = tmp_path / "test.yml"
    spec.write_text(yaml.safe_dump(test))
    done = subprocess.run([promtool(), "test", "rules", str(spec)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("server", [*SERVERS, None], ids=[*SERVERS, "every-server"])
def test_promtool_accepts_the_export(server: str | None, tmp_path: Path) -> None:
    out = tmp_path / "llmdiag-rules.yml"
    result = run_cli("rules", "export", *(["--server", server] if server else []), "-o", str(out))
    assert result.returncode == 0, result.stderr
    said = check_rules(out)
    groups = yaml.safe_load(out.read_text())["groups"]
    count = sum(len(g["rules"]) for g in groups)
    assert f"SUCCESS: {count} rules found" in said  # every rule parsed, none dropped
    names = [g["name"] for g in groups]
    for name in [server] if server else SERVERS:
        assert f"llmdiag-{name}-recording" in names and f"llmdiag-{name}-alerts" in names


def test_promtool_accepts_the_prometheusrule_groups(tmp_path: Path) -> None:
    result = run_cli("rules", "export", "--format", "prometheusrule", "--window", "2m", "--for", "90s")
    assert result.returncode == 0, result.stderr
    resource = yaml.safe_load(result.stdout)
    assert resource["kind"] == "PrometheusRule"
    groups = tmp_path / "groups.yml"
    groups.write_text(yaml.safe_dump(resource["spec"]))
    check_rules(groups)
    alerts = [r for g in resource["spec"]["groups"] for r in g["rules"] if "alert" in r]
    assert alerts and all(r["for"] == "90s" for r in alerts)


def test_promtool_accepts_hostile_selector_and_runbook_text(tmp_path: Path) -> None:
    """Quotes, a colon-space, a hash and braces in label values and annotation text: still valid YAML and PromQL."""
    out = tmp_path / "rules.yml"
    selector = '{job="a \\"quoted\\": #x", namespace=~"prod|{{staging}}"}'
    runbook = 'https://wiki.example/a: "b" #c/{code}?s={slug}&t=}}x'
    result = run_cli(
        "rules", "export", "--server", "vllm", "--selector", selector, "--runbook-url", runbook, "-o", str(out)
    )
    assert result.returncode == 0, result.stderr
    check_rules(out)
    alert = next(r for g in yaml.safe_load(out.read_text())["groups"] for r in g["rules"] if "alert" in r)
    assert alert["annotations"]["runbook_url"].startswith('https://wiki.example/a: "b" #c/')


def _series(instance: str, **values: str) -> list[dict[str, str]]:
    names = {
        "waiting": "vllm:num_requests_waiting",
        "running": "vllm:num_requests_running",
        "kv": "vllm:kv_cache_usage_perc",
        "preempted": "vllm:num_preemptions_total",
        "finished": "vllm:request_success_total",
        "generated": "vllm:generation_tokens_total",
        "prompted": "vllm:prompt_tokens_total",
        "itl_sum": "vllm:inter_token_latency_seconds_sum",
        "itl_count": "vllm:inter_token_latency_seconds_count",
        "rejected": "vllm:admission_rejections_total",
    }
    return [{"series": f'{names[k]}{{job="vllm",instance="{instance}"}}', "values": v} for k, v in values.items()]


def test_the_guards_evaluate_as_the_scan_ranks(tmp_path: Path) -> None:
    """Prometheus's rule engine (promtool test rules) on series written for the logic, not recorded from a server
    (the recorded states are tests/e2e/test_alert_rules_promtool.py's): four targets, 15 s apart for 15 minutes.
    a: a queue beside a quiet KV cache and fast steps (the batch cap); b: the same queue with a full, preempting KV
    cache and 503s (memory explains the scheduling symptoms); c: 503s alone; d: 503s across a restart (SAN002)."""
    steady = {"finished": "0+3x60", "generated": "0+600x60", "prompted": "0+300x60"}
    fast = {"itl_sum": "0+12x60", "itl_count": "0+600x60"}  # 20 ms a token
    inputs = [
        *_series("a", waiting="6x60", running="2x60", kv="0.3x60", preempted="0x60", **steady, **fast),
        *_series("b", waiting="6x60", running="20x60", kv="0.99x60", preempted="0+2x60", rejected="0+30x60", **steady),
        *_series("c", rejected="0+30x60"),
        *_series("d", rejected="0+30x30 0+30x29"),
    ]
    rules = tmp_path / "rules.yml"
    assert run_cli("rules", "export", "--server", "vllm", "-o", str(rules)).returncode == 0
    firing = 'sort(count by (code, instance) (ALERTS{alertstate="firing"}))'
    expected = [("MEM001", "b"), ("SAN002", "d"), ("SCH001", "a"), ("SCH004", "c")]
    passes_promtool_test(
        rules,
        inputs,
        [
            {
                "expr": firing,
                "eval_time": "10m",
                "exp_samples": [{"labels": f'{{code="{c}",instance="{i}"}}', "value": 1} for c, i in expected],
            }
        ],
        tmp_path,
    )


def test_implausible_samples_bound_the_divided_value_as_the_scan_does(tmp_path: Path) -> None:
    """TGI's batch-token ratio is tgi_batch_current_max_tokens over tgi_batch_max_total_tokens (the probe's
    ``divide_by``); its [0, 1] bounds are the ratio's. A batch that reserved 4000 of a 10000-token budget is
    plausible; 12000 of 10000 is not (SAN001). Two targets, 15 s apart for 15 minutes."""
    inputs = [
        {"series": f'tgi_batch_current_max_tokens{{job="tgi",instance="{i}"}}', "values": f"{held}x60"}
        for i, held in (("ok", 4000), ("over", 12000))
    ] + [
        {"series": f'tgi_batch_max_total_tokens{{job="tgi",instance="{i}"}}', "values": "10000x60"}
        for i in ("ok", "over")
    ]
    rules = tmp_path / "rules.yml"
    assert run_cli("rules", "export", "--server", "tgi", "-o", str(rules)).returncode == 0
    passes_promtool_test(
        rules,
        inputs,
        [
            {
                "expr": 'count by (code, instance) (ALERTS{alertstate="firing",code="SAN001"})',
                "eval_time": "10m",
                "exp_samples": [{"labels": '{code="SAN001",instance="over"}', "value": 1}],
            }
        ],
        tmp_path,
    )


def test_a_value_hovering_at_the_critical_line_still_pages_as_a_warning(tmp_path: Path) -> None:
    """503s at a rate that crosses SCH004's critical line every evaluation (0.8/s, then 0.2/s, over a 15 s window at
    15 s scrapes): the critical alert's for: restarts each time and it never fires; the warning one fires, as the
    value never leaves the warning band's floor. A steady 1/s fires the critical alert alone: never both."""
    hovering, total = [], 0
    for step in range(61):
        hovering.append(str(total))
        total += 12 if step % 2 == 0 else 3  # +12 then +3 in 15 s: 0.8/s then 0.2/s
    inputs = [
        {"series": 'vllm:admission_rejections_total{job="vllm",instance="hover"}', "values": " ".join(hovering)},
        {"series": 'vllm:admission_rejections_total{job="vllm",instance="steady"}', "values": "0+15x60"},
    ]
    rules = tmp_path / "rules.yml"
    done = run_cli("rules", "export", "--server", "vllm", "--window", "15s", "--for", "1m", "-o", str(rules))
    assert done.returncode == 0, done.stderr
    firing = 'count by (code, instance, severity) (ALERTS{alertstate="firing",code="SCH004"})'
    expected = [("hover", "warning"), ("steady", "critical")]
    passes_promtool_test(
        rules,
        inputs,
        [
            {
                "expr": firing,
                "eval_time": t,
                "exp_samples": [
                    {"labels": f'{{code="SCH004",instance="{i}",severity="{s}"}}', "value": 1} for i, s in expected
                ],
            }
            for t in ("5m", "10m", "10m15s")
        ],
        tmp_path,
    )
