"""The rule export (llmdiag.api.alerting over llmdiag.schema.promql): the expressions' shape, read off the YAML.

promtool proves the file valid (tests/e2e/test_rules_export.py); here each piece of an expression is traced back to
the catalogue it comes from, so a change to the catalogue or the generator that drops a gate, a guard or a rename
fails here.
"""

from __future__ import annotations

import re

import pytest
import yaml

from llmdiag.api import alerting
from llmdiag.api.alerting import export_rules
from llmdiag.engine import causes
from llmdiag.errors import UsageError
from llmdiag.model import Category
from llmdiag.schema.loader import find_rule, load_probe
from llmdiag.schema.promql import Recorder, parse_duration, window_name
from llmdiag.schema.rules import ENGINES


def _groups(**kw) -> dict[str, list[dict]]:
    document = yaml.safe_load(export_rules(**kw))
    return {g["name"]: g["rules"] for g in document["groups"]}


def _records(server: str = "vllm", **kw) -> dict[str, str]:
    rules = _groups(server=server, **kw)[f"llmdiag-{server}-recording"]
    return {r["record"]: r["expr"] for r in rules if "code" not in r.get("labels", {})}


def _conditions(server: str = "vllm", **kw) -> dict[str, str]:
    rules = _groups(server=server, **kw)[f"llmdiag-{server}-recording"]
    return {r["labels"]["code"]: r["expr"] for r in rules if "code" in r.get("labels", {})}


def _alerts(server: str = "vllm", **kw) -> dict[tuple[str, str], dict]:
    rules = _groups(server=server, **kw)[f"llmdiag-{server}-alerts"]
    return {(r["labels"]["code"], r["labels"]["severity"]): r for r in rules}


def _silencers(alert: dict) -> set[str]:
    """The codes whose recorded condition an alert is `unless`-ed by."""
    found = re.search(r'unless on \([^)]*\) \(llmdiag:rule_past_warning:value\w+\{code=~?"([^"]+)"', alert["expr"])
    return set(found.group(1).split("|")) if found else set()


def test_a_rename_across_versions_becomes_or_alternatives_from_the_probe() -> None:
    spec = next(s for s in load_probe("vllm").signal if s.name == "kv_cache_usage_ratio")
    assert len(spec.metrics) >= 2  # the renamed gauge: vllm:kv_cache_usage_perc, formerly vllm:gpu_cache_usage_perc
    now = _records()["llmdiag:kv_cache_usage_ratio:avg"]
    parts = now.split(" or ")
    assert len(parts) == len(spec.metrics)
    for part, wire in zip(parts, spec.metrics, strict=True):  # newest first: the first present wins
        assert wire in part and part.count("avg by (job, instance, namespace, pod)") == 1  # the probe's mean


def test_counters_histograms_and_gauges_use_the_window() -> None:
    records = _records(window="3m")
    assert "rate(vllm:num_preemptions_total[3m])" in records["llmdiag:preemptions_per_second:rate3m"]
    assert records["llmdiag:kv_cache_usage_ratio:max3m"].startswith("max_over_time(llmdiag:kv_cache_usage_ratio:avg{")
    p50 = records["llmdiag:ttft_seconds:p503m"]
    assert p50.startswith("histogram_quantile(0.5, sum by (job, instance, namespace, pod, le) (rate(")
    assert "_bucket[3m]" in p50
    mean = records["llmdiag:itl_seconds:mean3m"]
    assert "rate(vllm:inter_token_latency_seconds_sum[3m])" in mean
    assert "rate(vllm:inter_token_latency_seconds_count[3m])" in mean


def test_littles_law_reads_the_sum_over_the_window_beside_the_gauge_mean() -> None:
    waiting = _records()["llmdiag:requests_waiting_avg:value5m"]
    # the larger of the two estimates, as llmdiag.engine.derived._time_average takes it
    assert waiting.startswith("max without (llmdiag_part) (")
    assert 'llmdiag:queue_time_seconds:sum5m{llmdiag_server="vllm"} / 300' in waiting
    assert 'llmdiag:requests_waiting:mean5m{llmdiag_server="vllm"}' in waiting


def test_every_recorded_read_is_this_servers_copy() -> None:
    text = export_rules()  # every server: the same record names, told apart by llmdiag_server
    for name in re.findall(r"(llmdiag:[a-z0-9_]+:[a-z0-9_]+)\{", text):
        assert name.startswith("llmdiag:")
    for match in re.finditer(r"llmdiag:[a-z0-9_]+:[a-z0-9_]+(\{[^}]*\})?", text):
        if "record:" in text[max(0, match.start() - 8) : match.start()]:
            continue
        assert match.group(1) and "llmdiag_server=" in match.group(1), match.group(0)


def test_ladder_gates_and_if_missing_pass() -> None:
    rule = find_rule("CMP001")
    assert rule is not None
    passing = [g for g in rule.gate if g.if_missing == "pass"]
    required = [g for g in rule.gate if g.if_missing == "skip"]
    assert passing and required  # the shape under test: one gate of each kind
    condition = _conditions()["CMP001"]
    ladder = f'llmdiag:itl_mean_over_slo_tpot_ratio:value5m{{llmdiag_server="vllm"}} >= {rule.severity.warning:g}'
    assert ladder in condition
    for gate in passing:  # a server without it passes: unless the negation holds
        negated = alerting.NEGATED[gate.op]
        assert re.search(
            rf"unless on \([^)]*\) \(llmdiag:{gate.signal}:{gate.stat}5m\{{[^}}]*\}} {negated} ", condition
        )
    for gate in required:  # and: a missing signal makes the whole expression empty (skipped, never healthy)
        assert re.search(rf"and on \([^)]*\) \(llmdiag:{gate.signal}:{gate.stat}5m\{{[^}}]*\}} {gate.op} ", condition)
    alerts = _alerts()
    assert rule.severity.critical is not None
    # the warning alert: past warning unless the same code's critical alert fires on the target (not "below critical")
    assert alerts[("CMP001", "warning")]["expr"].startswith(
        '(llmdiag:rule_past_warning:value5m{code="CMP001",llmdiag_server="vllm"} unless on (job, instance, namespace, '
        'pod, llmdiag_server) (ALERTS{alertname="LLMDiagDecodeStepSlow",code="CMP001",severity="critical",'
        'alertstate="firing",llmdiag_server="vllm"}))'
    )
    assert f">= {rule.severity.critical:g})" in alerts[("CMP001", "critical")]["expr"]


def test_labels_and_annotations() -> None:
    alert = _alerts(runbook_url="https://runbooks.example/{code}/{slug}")[("MEM001", "critical")]
    assert alert["alert"] == "LLMDiagKvCacheSaturated"
    assert alert["labels"] == {"severity": "critical", "code": "MEM001", "class": "memory", "llmdiag_server": "vllm"}
    assert alert["annotations"]["runbook_url"] == "https://runbooks.example/MEM001/kv-cache-saturated"
    assert "{{ $value" in alert["annotations"]["summary"]
    assert "--gpu-memory-utilization 0.95" in alert["annotations"]["fix"]  # vLLM's own flags
    assert alert["for"] == "2m"
    sglang = _alerts("sglang")[("MEM001", "warning")]
    assert (
        "--mem-fraction-static" in sglang["annotations"]["fix"]
        and "--gpu-memory-utilization" not in sglang["annotations"]["fix"]
    )


def test_a_sanity_rule_silences_the_capacity_alerts_that_read_what_it_doubts() -> None:
    alerts = _alerts()
    # SAN001 doubts bounded gauges (KV usage): SCH001 reads the KV gauge, SCH004 reads only a counter
    assert "SAN001" in _silencers(alerts[("SCH001", "warning")])
    assert "SAN001" not in _silencers(alerts[("SCH004", "warning")])
    # SAN002 (a restart) doubts every rate
    assert "SAN002" in _silencers(alerts[("SCH004", "critical")])
    # sanity alerts themselves are never silenced
    assert not _silencers(alerts[("SAN002", "warning")])


def test_precedence_comes_from_the_cause_graph(monkeypatch: pytest.MonkeyPatch) -> None:
    alerts = _alerts()
    memory_codes = {code for code, _ in alerts if code.startswith("MEM")}
    assert memory_codes <= _silencers(alerts[("SCH001", "warning")])  # memory explains scheduling
    # a stall explains every capacity finding (MEM007 is memory's stall): the rest of memory's rules
    memory_codes = {code for code in memory_codes if not (rule := find_rule(code)) or not rule.stall}
    assert not memory_codes & _silencers(alerts[("CMP002", "warning")])  # memory does not explain compute
    # a new edge in CAUSES (memory explains compute) appears in the export: the graph is read, not copied
    graph = {cause: dict(symptoms) for cause, symptoms in causes.CAUSES.items()}
    graph[Category.memory][Category.compute] = "a test's edge"
    monkeypatch.setattr(causes, "CAUSES", graph)
    assert memory_codes <= _silencers(_alerts()[("CMP002", "warning")])


def test_a_stand_in_rule_judges_only_where_the_rule_it_stands_in_for_cannot() -> None:
    mem005 = find_rule("MEM005")
    assert mem005 is not None and mem005.instead_of == "MEM001"
    condition = _conditions()["MEM005"]
    assert "unless on (" in condition and "llmdiag:preemptions_per_finished_request:value5m" in condition


def test_fleet_and_regression_rules_are_listed_as_left_out() -> None:
    text = export_rules(server="vllm")
    assert "#   SCH008: fleet scope" in text
    assert "#   REG001: compares with a baseline" in text
    assert "SCH008" not in {code for code, _ in _alerts()}


@pytest.mark.parametrize("code", ["MEM001", "MEM003", "MEM005", "SCH001", "SCH002", "SCH003", "SCH004", "CMP001"])
def test_the_rules_the_issue_names_are_expressible_for_vllm(code: str) -> None:
    assert (code, "warning") in _alerts()


@pytest.mark.parametrize("code", ["CMP002", "SAN001", "SAN002", "SAN003"])
def test_the_rest_the_issue_names_are_expressible_for_vllm(code: str) -> None:
    assert (code, "warning") in _alerts()


def test_prometheusrule_holds_the_same_groups() -> None:
    plain = yaml.safe_load(export_rules(server="tgi"))
    resource = yaml.safe_load(export_rules(server="tgi", format="prometheusrule"))
    assert resource["apiVersion"] == "monitoring.coreos.com/v1" and resource["kind"] == "PrometheusRule"
    assert resource["spec"] == plain


def test_label_values_and_text_are_escaped_yaml() -> None:
    nasty = 'job="a\\"b: #c"'
    document = yaml.safe_load(export_rules(server="vllm", selector="{" + nasty + "}"))
    exprs = [r["expr"] for r in document["groups"][0]["rules"]]
    assert any(nasty in e for e in exprs)  # the matcher survives the YAML round trip verbatim


@pytest.mark.parametrize(
    ("kwargs", "names"),
    [
        ({"server": "nginx"}, "server"),
        ({"selector": '{job="vllm"'}, "selector"),
        ({"selector": "job=vllm"}, "selector"),
        ({"window": "5 minutes"}, "window"),
        ({"for_duration": "-1s"}, "for_duration"),
        ({"window": "0s"}, "window"),
        ({"format": "json"}, "format"),
        ({"runbook_url": "https://x/{rule}"}, "runbook_url"),
    ],
)
def test_bad_input_is_a_usage_error_naming_the_option(kwargs: dict, names: str) -> None:
    with pytest.raises(UsageError) as raised:
        export_rules(**kwargs)
    assert names in raised.value.message and raised.value.hint


def test_window_names() -> None:
    assert window_name(parse_duration("5m")) == "5m"
    assert window_name(90) == "90s" and window_name(3600) == "1h" and window_name(0) == "0s"
    alerts = _alerts(for_duration="0s")
    assert alerts[("MEM001", "warning")]["for"] == "0s"


def test_an_info_label_is_not_expressible() -> None:
    recorder = Recorder(probe=load_probe("vllm"), window_seconds=300)
    with pytest.raises(Exception, match="label"):
        recorder.ref("kv_cache_blocks", "value")


def test_grafana_draws_each_ladders_thresholds_on_its_signals_panel() -> None:
    import json

    dashboard = json.loads(export_rules(server="vllm", format="grafana", window="2m"))
    panels = {p["title"]: p for p in dashboard["panels"] if p["type"] == "timeseries"}
    recorded = [name for name in _records(window="2m") if name.endswith("2m")]
    assert len(panels) == len(recorded)  # one panel per signal the rules read over the window
    for code in ("MEM001", "SCH004"):
        rule = find_rule(code)
        assert rule is not None
        panel = panels[f"{rule.severity.signal} {rule.severity.stat} (2m)"]
        steps = [s["value"] for s in panel["fieldConfig"]["defaults"]["thresholds"]["steps"]]
        assert steps == [None, rule.severity.warning, rule.severity.critical]
        assert panel["targets"][0]["expr"] == (
            f'llmdiag:{rule.severity.signal}:{rule.severity.stat}2m{{llmdiag_server="vllm"}}'
        )


def test_the_settings_overrides_and_mutes_apply_as_in_a_scan() -> None:
    from llmdiag.config import Mute, RuleOverride, Settings

    settings = Settings(
        slo_tpot_seconds=0.1,
        rules={"SCH001": RuleOverride(warning=2.5, critical=7.5)},
        mute=[Mute(code="SCH012", reason="the router queues on purpose")],
    )
    conditions = _conditions(settings=settings)
    assert 'llmdiag:requests_waiting_avg:value5m{llmdiag_server="vllm"} >= 2.5' in conditions["SCH001"]
    assert "SCH012" not in conditions
    alerts = _alerts(settings=settings)
    assert ">= 7.5)" in alerts[("SCH001", "critical")]["expr"] and "7.5" not in alerts[("SCH001", "warning")]["expr"]
    assert "#   SCH012: muted in the settings: the router queues on purpose" in export_rules(
        server="vllm", settings=settings
    )
    assert "/ 0.1" in _records(settings=settings)["llmdiag:itl_mean_over_slo_tpot_ratio:value5m"]
    assert "/ 0.2" in _records(settings=settings, slo_tpot_seconds=0.2)["llmdiag:itl_mean_over_slo_tpot_ratio:value5m"]


def test_a_probes_estimate_stands_in_for_a_signal_its_page_lacks() -> None:
    spec = load_probe("trtllm")
    assert "preemptions_per_second" not in {s.name for s in spec.signal}  # the page has no preemption counter
    rate = _records("trtllm")["llmdiag:preemptions_per_second:rate5m"]
    assert rate == (
        'llmdiag:requests_paused:mean5m{llmdiag_server="trtllm"} / '
        '(llmdiag:iteration_latency_seconds:mean5m{llmdiag_server="trtllm"} > 0)'
    )
    assert "SCH001" in _conditions("trtllm")  # its gate reads the estimate


def test_a_monotonic_gauge_is_read_as_a_count_only_in_promql_forms() -> None:
    counter = next(s for s in load_probe("triton").signal if s.name == "iteration_counter")
    assert counter.kind == "gauge" and counter.monotonic  # the scan reads it as a gauge
    records = _records("triton")
    assert (
        'rate(nv_trt_llm_general_metrics{general_type="iteration_counter"}[5m])'
        in records["llmdiag:iteration_counter:rate5m"]
    )
    assert (
        records["llmdiag:itl_seconds:mean5m"] == '1 / (llmdiag:iteration_counter:rate5m{llmdiag_server="triton"} > 0)'
    )
    with pytest.raises(Exception, match="no rate"):
        Recorder(probe=load_probe("vllm"), window_seconds=300).ref("requests_running", "rate")


@pytest.mark.parametrize("server", alerting.SERVERS)
def test_every_rule_is_exported_or_listed_with_its_reason(server: str) -> None:
    from llmdiag.schema.loader import load_rules

    text = export_rules(server=server)
    exported = {code for code, _ in _alerts(server)}
    listed = dict(re.findall(r"^#   ([A-Z]{3}\d{3}): (.+)$", text, re.M))
    codes = {r.code for r in load_rules() if r.status != "deprecated"}
    assert exported | set(listed) == codes and not exported & set(listed)
    assert all(len(why) > 10 for why in listed.values())


def test_gpu_telemetry_is_joined_to_each_server_target_by_pod_else_by_host() -> None:
    now = _records()["llmdiag:dram_active_ratio:avg"]
    by_pod, by_host = now.split(" or max without (llmdiag_host) ", 1)
    # dcgm-exporter's pod mapping first: the GPUs of the server's own pod
    assert 'on (namespace, pod) group_left () (avg by (namespace, pod) (DCGM_FI_PROF_DRAM_ACTIVE{pod!=""}))' in by_pod
    assert by_pod.startswith('(llmdiag:targets:group{llmdiag_server="vllm"} * ')
    # else the host: the exporter's Hostname label over its instance's host, as the fleet mode joins it
    assert by_host.index('"instance", "(.+):[0-9]+"') < by_host.index('"Hostname", "(.+)"')
    assert "on (llmdiag_host) group_left () (avg by (llmdiag_host) (" in by_host
    # the rules that read GPU telemetry export, and NET001's class silences the queue it explains
    alerts = _alerts()
    assert ("CMP004", "warning") in alerts and ("NET001", "warning") in alerts
    assert "NET001" in _silencers(alerts[("SCH002", "warning")])


@pytest.mark.parametrize("server", alerting.SERVERS)
def test_implausible_samples_read_each_bounded_signal_as_the_signal_is(server: str) -> None:
    """The valid range of a signal with ``divide_by`` is the ratio's (llmdiag.collect.signals checks it after the
    division): the sanity count divides too, for every server."""
    implausible = _records(server).get("llmdiag:implausible_samples:value5m", "")
    for spec in load_probe(server).signal:
        if spec.kind == "gauge" and spec.divide_by and (spec.valid_min is not None or spec.valid_max is not None):
            for wire in spec.metrics:
                assert f"({wire}) / on (job, instance, namespace, pod) group_left ()" in implausible
                assert spec.divide_by in implausible


def _firing_signals(rule, probe: str):
    """Signals at which the scan's evaluate_rule fires ``rule``: its ladder at the warning threshold, each gate met
    at its own value (None where two of its references ask one signal's stat for different values)."""
    from llmdiag.model import Signal, SignalSet, SourceInfo, Window

    met = {">": 1.0, ">=": 0.0, "<": -1.0, "<=": 0.0, "==": 0.0, "!=": 1.0}
    wanted: dict[tuple[str, str], float] = {(rule.severity.signal, rule.severity.stat): rule.severity.warning}
    for gate in rule.gate:
        value = gate.value + met[gate.op]
        if wanted.setdefault((gate.signal, gate.stat), value) != value:
            return None
    signals = SignalSet(window=Window(duration_seconds=300.0, scrapes=31), sources=[SourceInfo(probe=probe)])
    stats: dict[str, dict[str, float]] = {}
    for (name, stat), value in wanted.items():
        stats.setdefault(name, {})[stat] = value
    for name, values in stats.items():
        signals.add(Signal(name=name, kind="gauge", unit="", stats=values))
    return signals


@pytest.mark.parametrize("server", alerting.SERVERS)
def test_applies_to_is_treated_alike_by_the_scan_and_the_export(server: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """fix.applies_to names the engines with flags for the fix; the scan judges a rule wherever its inputs exist
    (llmdiag.engine.evaluate), with the fix's text alone elsewhere. The export must agree: what it judges for a
    server reads only that server's probe signals and DCGM's, whatever applies_to says, and its fix annotation is
    the scan's fixes for that engine."""
    from llmdiag.config import Settings
    from llmdiag.engine.evaluate import evaluate_rule
    from llmdiag.engine.fixes import engine_of, fixes_for
    from llmdiag.schema.loader import load_rules

    engine = engine_of(server)
    provided = {s.name for s in load_probe(server).signal} | {s.name for s in load_probe("dcgm").signal}
    out = alerting._build_server(server, inner="", window_seconds=300.0, settings=Settings())
    exported = {a.rule.code for a in out.alerts}
    for alert in out.alerts:
        reads = out.recorder.inputs_of(alert.condition())
        assert reads and reads <= provided, (alert.rule.code, reads - provided)
    assert not [why for _, why in out.left_out if "applies_to" in why]
    fixes = {(r["labels"]["code"]): r["annotations"]["fix"] for r in _alerts(server).values()}
    for code in exported:
        rule = next(r for r in load_rules() if r.code == code)
        assert fixes[code] == "\n".join(fixes_for(rule, engine))
    # the scan: a rule outside applies_to still fires on this server's signals, with the fix's text alone
    outside = [r for r in load_rules() if engine not in r.fix.applies_to and r.status != "deprecated"]
    judged = 0
    for rule in outside:
        signals = _firing_signals(rule, server)
        if signals is None:
            continue
        _, finding = evaluate_rule(rule, signals, Settings(), server)
        assert finding is not None and finding.fixes == [rule.fix.text], rule.code
        judged += 1
    assert judged or not outside
    # the export: the same rules with applies_to widened to every engine, or narrowed to none of this one's, judge
    # the same codes
    for narrowed in (True, False):
        rules = [
            r.model_copy(
                update={
                    "fix": r.fix.model_copy(
                        update={
                            "applies_to": [e for e in r.fix.applies_to if e != engine] if narrowed else list(ENGINES)
                        }
                    )
                }
            )
            for r in load_rules()
        ]
        monkeypatch.setattr(alerting, "load_rules", lambda rules=rules: rules)
        again = alerting._build_server(server, inner="", window_seconds=300.0, settings=Settings())
        assert {a.rule.code for a in again.alerts} == exported


def test_llamacpp_time_per_token_is_estimated_as_its_scan_derives_it() -> None:
    """llama.cpp has no latency histogram: the scan derives the mean time per token from its generation counters
    (llmdiag.collect.servers.llamacpp), and so does the export (probes/llamacpp.toml's estimate), so the rules that
    read it (CMP004 on the compute preset) judge there too."""
    itl = _records("llamacpp")["llmdiag:itl_seconds:mean5m"]
    assert itl.startswith('llmdiag:generation_busy_seconds_per_second:rate5m{llmdiag_server="llamacpp"} / (')
    assert (
        "rate(llamacpp:tokens_predicted_total[5m])"
        in _records("llamacpp")["llmdiag:generation_tokens_per_second:rate5m"]
    )
    assert ("CMP004", "warning") in _alerts("llamacpp")
