"""Live parity of the exported alerting rules with `llmdiag scan`: a real Prometheus (Debian's) loads
`llmdiag rules export`'s file and scrapes the simulator in every preset, one dialect at a time (the five presets of a
dialect at once, one scrape job each, scraped and evaluated every second); after the rules' ``for:`` its
/api/v1/alerts is compared with a live scan of the same target over the same seconds.

The rules are exported with a short window and ``for:`` (``WINDOW``, ``FOR``): at a 1 s scrape interval the window
holds ten scrapes, and the ``for:`` five evaluations, so each dialect takes about half a minute.

Agreement, per target: the scan's primary finding (its first capacity finding: the verdict's class, or the advisory
SLO breach of an ``unknown`` verdict) is among the firing alerts that name the class by the scan's own order
(``llmdiag.engine.causes``: classes no other firing class explains, the most severe, stable before preview;
advisory only when nothing else fires). The scan breaks a tie of one severity by how far past its threshold each
finding is, which an alert does not carry: every code of the tie counts. A target the scan finds nothing wrong with
has no capacity alert firing. A sanity (SAN) alert is tolerated only where the scan also reports that code. No alert
of another server's rules fires on a target.

vLLM, SGLang, TensorRT-LLM and Triton must agree on every preset. TGI and llama.cpp export too little to judge
everything the scan judges (the scan also reads llama.cpp's /props and its own canary requests): where the scan's
primary code has no alerting rule for that server, the row says so and lists the export's own reasons (its comment
lines); every other row must agree, and a healthy server has no alert on any dialect.

With Alertmanager installed (``python -m tests.support.alertmanager_server install``), the vLLM run also routes its
alerts to a real Alertmanager and checks the memory preset's MEM001 alert arrives there with its labels and
annotations. ``LLMDIAG_ALERT_EXAMPLE=PATH`` writes that alert, as Alertmanager's /api/v2/alerts shows it (volatile
fields dropped, provenance added), to PATH: the README's example (docs/examples/alert-MEM001.json).

The bench/alert_rules_fleet.py test at the end runs the 50-target bench at 3 targets, so that it cannot rot.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import pytest
import requests

from bench.sim_process import SimProcess
from llmdiag import __version__ as llmdiag_version
from llmdiag.engine.causes import why
from llmdiag.model import Category
from llmdiag.schema.loader import load_rules
from llmdiag.schema.rules import RuleSpec
from llmdiag.sim.presets import PRESETS
from tests.conftest import REPO_ROOT, run_cli
from tests.support import alertmanager_server, prometheus_server

WINDOW, FOR = "10s", "5s"
WINDOW_SECONDS, FOR_SECONDS = 10, 5
SCAN_SECONDS = 10
# after the first scrape: the window fills, the recording group then the alerting group evaluate, the for: passes
SETTLE_SECONDS = WINDOW_SECONDS + FOR_SECONDS + 6
READINGS = 3  # /api/v1/alerts read this many times, a second apart: an alert firing at any of them counts
FULL_PARITY = ("vllm", "sglang", "trtllm", "triton")
PARTIAL = ("tgi", "llamacpp")
# where Prometheus scrapes each dialect; trtllm-serve's /metrics is its JSON iteration log, read once per record
SCRAPE_PATHS = {"trtllm": "/prometheus/metrics"}
CAPACITY = {Category.memory, Category.compute, Category.scheduling, Category.network}
SEVERITY_RANK = {"warning": 1, "critical": 2}
EXAMPLE_ENV = "LLMDIAG_ALERT_EXAMPLE"
VOLATILE = ("startsAt", "endsAt", "updatedAt", "fingerprint", "generatorURL")


def _specs() -> dict[str, RuleSpec]:
    return {r.code: r for r in load_rules()}


def primary_alert_codes(fired: list[tuple[str, str]]) -> set[str]:
    """The codes among firing (code, severity) alerts that name the class, by the scan's order (module docstring)."""
    specs = _specs()

    def cat(code: str) -> Category:
        return Category(specs[code].category)

    capacity = [(c, s) for c, s in fired if c in specs and cat(c) in CAPACITY]
    pool = [x for x in capacity if not specs[x[0]].advisory] or capacity
    pool = [x for x in pool if specs[x[0]].stall] or pool
    classes = {cat(c) for c, _ in pool}
    roots = [x for x in pool if not any(why(other, cat(x[0])) for other in classes if other is not cat(x[0]))]
    if not roots:
        return set()

    def rank(x: tuple[str, str]) -> tuple[int, bool]:
        return SEVERITY_RANK.get(x[1], 0), specs[x[0]].status != "preview"

    best = max(rank(x) for x in roots)
    return {c for c, s in roots if rank((c, s)) == best}


def scan_primary(verdict: dict) -> str | None:
    """The scan's primary: its first finding that is not a sanity one (None: nothing wrong)."""
    return next((f["code"] for f in verdict["findings"] if f["category"] != "sanity"), None)


@dataclass
class Row:
    dialect: str
    preset: str
    bottleneck: str = "?"
    scan_codes: list[str] = field(default_factory=list)
    primary: str | None = None
    firing: set[tuple[str, str]] = field(default_factory=set)  # (code, severity) of this server's alerts
    foreign: set[str] = field(default_factory=set)  # alerts of another server's rules on this target
    verdict: str = "?"  # agree | DISAGREE | not expressible (...)

    def cells(self) -> list[str]:
        alerts = ", ".join(f"{c}/{s}" for c, s in sorted(self.firing)) or "-"
        return [self.preset, self.dialect, f"{self.primary or '-'} ({self.bottleneck})", alerts, self.verdict]


def table(rows: list[Row]) -> str:
    head = ["preset", "dialect", "scan primary (class)", "alerts firing", "agree"]
    cells = [head, *[r.cells() for r in rows]]
    widths = [max(len(c[i]) for c in cells) for i in range(len(head))]
    return "\n".join("  ".join(c[i].ljust(widths[i]) for i in range(len(head))) for c in cells)


# --------------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> Path:
    prometheus_server.require()
    path = tmp_path_factory.mktemp("rules") / "llmdiag-rules.yml"
    result = run_cli("rules", "export", "--format", "prometheus", "--window", WINDOW, "--for", FOR, "-o", str(path))
    assert result.returncode == 0, result.stderr
    return path


def alert_codes(prom: prometheus_server.PrometheusServer, server: str) -> set[str]:
    """The codes of the alerting rules Prometheus loaded for ``server`` (its /api/v1/rules)."""
    groups = requests.get(f"{prom.url}/api/v1/rules", timeout=10).json()["data"]["groups"]
    return {
        r["labels"]["code"]
        for g in groups
        if g["name"] == f"llmdiag-{server}-alerts"
        for r in g["rules"]
        if r["type"] == "alerting"
    }


def inexpressible(path: Path, server: str) -> list[str]:
    """The export's comment lines that say what it cannot express (for ``server``, or for every server)."""
    lines = [line.strip() for line in path.read_text().splitlines() if line.strip().startswith("#")]
    return [line for line in lines if re.search(r"not expressible|never reach", line, re.I)]


def start_scans(dialect: str, urls: dict[str, str]) -> dict[str, subprocess.Popen[str]]:
    """A live scan of each target, all at once (subprocesses: the CLI exactly as a user runs it)."""
    env = {**os.environ, "COLUMNS": "200"}
    env.pop("LLMDIAG_API_KEY", None)
    return {
        preset: subprocess.Popen(
            [sys.executable, "-m", "llmdiag", "scan", url, "--no-nvml", "--duration", str(SCAN_SECONDS), "--json"]
            + ["--fail-on", "never"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO_ROOT,
            env=env,
        )
        for preset, url in urls.items()
    }


def read_firing(prom: prometheus_server.PrometheusServer) -> list[dict]:
    """Every alert firing at any of ``READINGS`` readings of /api/v1/alerts, a second apart (by label set)."""
    seen: dict[str, dict] = {}
    for i in range(READINGS):
        for alert in prom.alerts():
            if alert["state"] == "firing":
                seen[json.dumps(alert["labels"], sort_keys=True)] = alert
        if i + 1 < READINGS:
            time.sleep(1)
    return list(seen.values())


def judge(row: Row, server: str, exported_codes: set[str], partial: bool) -> None:
    tops = primary_alert_codes(sorted(row.firing))
    sanity_ok = all(c in row.scan_codes for c, _ in row.firing if c.startswith("SAN"))
    capacity_firing = {c for c, _ in row.firing if not c.startswith("SAN")}
    if row.primary is None:
        ok = not capacity_firing and sanity_ok and not row.foreign
    elif partial and row.primary not in exported_codes:
        row.verdict = f"not expressible ({row.primary} has no {server} alert)"
        return
    else:
        ok = row.primary in tops and sanity_ok and not row.foreign
    row.verdict = "agree" if ok else "DISAGREE"


@dataclass
class Run:
    rows: list[Row]
    exported_codes: set[str]
    example: dict | None = None  # the MEM001 alert as Alertmanager shows it (vLLM, with Alertmanager)


def run_dialect(dialect: str, rules: Path) -> Run:
    server = dialect  # a dialect is named as the export's --server names its server
    path = SCRAPE_PATHS.get(dialect, "/metrics")
    with ExitStack() as stack:
        sims = {p: stack.enter_context(SimProcess(p, load=True, dialect=dialect)) for p in PRESETS}
        am = None
        if dialect == "vllm" and alertmanager_server.missing() is None:
            am = stack.enter_context(alertmanager_server.AlertmanagerServer())
        groups: dict[str, list[prometheus_server.Target]] = {
            f"{dialect}-{p}": [(s.url + path, {"pod": f"{dialect}-{p}", "namespace": "llm"})] for p, s in sims.items()
        }
        prom = stack.enter_context(
            prometheus_server.PrometheusServer(
                groups, rule_files=[rules], alertmanagers=[am.address] if am is not None else []
            )
        )
        scans = start_scans(dialect, {p: s.url for p, s in sims.items()})
        started = time.monotonic()
        exported_codes = alert_codes(prom, server)
        time.sleep(max(0.0, SETTLE_SECONDS - (time.monotonic() - started)))
        firing = read_firing(prom)
        rows = []
        for preset, proc in scans.items():
            out, err = proc.communicate(timeout=120)
            assert proc.returncode == 0, f"{dialect}/{preset} scan: {err[-2000:]}"
            verdict = json.loads(out)
            row = Row(dialect, preset, verdict["bottleneck"], [f["code"] for f in verdict["findings"]])
            row.primary = scan_primary(verdict)
            for alert in firing:
                labels = alert["labels"]
                if labels.get("pod", labels.get("job")) != f"{dialect}-{preset}":
                    continue
                if labels.get("llmdiag_server") == server:
                    row.firing.add((labels["code"], labels["severity"]))
                else:
                    row.foreign.add(f"{labels.get('llmdiag_server')}:{labels.get('code')}")
            judge(row, server, exported_codes, dialect in PARTIAL)
            rows.append(row)
        example = None
        if am is not None:
            held = am.alerts()
            example = next((a for a in held if a["labels"].get("code") == "MEM001"), None)
            assert example is not None, f"no MEM001 alert reached Alertmanager: {[a['labels'] for a in held]}"
        return Run(rows, exported_codes, example)


def write_example(alert: dict, path: Path) -> None:
    """The alert as Alertmanager showed it, volatile fields dropped, with where it came from."""
    kept = {k: v for k, v in alert.items() if k not in VOLATILE}
    prom_version = subprocess.run(
        [prometheus_server.BINARY, "--version"], capture_output=True, text=True, check=False
    ).stdout.splitlines()[0]
    doc = {
        "provenance": {
            "command": f"{EXAMPLE_ENV}={path.name} pytest tests/e2e/test_alert_rules_live.py -k vllm",
            "source": "GET /api/v2/alerts of a real Alertmanager, one alert of the list, verbatim",
            "exported_with": f"llmdiag rules export --format prometheus --window {WINDOW} --for {FOR}",
            "target": "the built-in simulator, preset memory, vLLM dialect, scraped every second",
            "dropped": list(VOLATILE),
            "date": datetime.now(timezone.utc).strftime("%Y-%m-%d"),
            "versions": {
                "llmdiag": llmdiag_version,
                "prometheus": prom_version.strip(),
                "alertmanager": alertmanager_server.version(),
            },
        },
        "alert": kept,
    }
    path.write_text(json.dumps(doc, indent=2) + "\n")


@pytest.mark.parametrize("dialect", [*FULL_PARITY, *PARTIAL])
def test_alerts_agree_with_scan(dialect: str, exported: Path) -> None:
    run = run_dialect(dialect, exported)
    server = dialect  # a dialect is named as the export's --server names its server
    print(f"\n{dialect}: alert codes exported for {server}: {', '.join(sorted(run.exported_codes)) or 'none'}")
    print(table(run.rows))
    if dialect in PARTIAL:
        for line in inexpressible(exported, server):
            print(f"  export says: {line}")
    assert run.exported_codes, f"no alerting rule loaded for {server}"
    assert all(r.verdict != "DISAGREE" for r in run.rows), table(run.rows)
    healthy = next(r for r in run.rows if r.preset == "healthy")
    assert healthy.primary is None, f"the scan of the healthy preset found {healthy.scan_codes}"
    if run.example is not None:
        assert run.example["labels"]["severity"] in SEVERITY_RANK
        assert run.example["labels"]["class"] == "memory"
        assert run.example["labels"]["llmdiag_server"] == "vllm"
        assert "{{" not in run.example["annotations"]["summary"]
        assert "MEM001" in run.example["annotations"]["runbook_url"]
        if os.environ.get(EXAMPLE_ENV):
            write_example(run.example, Path(os.environ[EXAMPLE_ENV]))


def test_fleet_bench_runs_at_a_tiny_scale(tmp_path: Path) -> None:
    """bench/alert_rules_fleet.py at 3 targets from one simulator: it exports, loads, and reads every llmdiag group's
    own figures from Prometheus (the 50-target run is the bench's; its figures are not asserted here)."""
    prometheus_server.require()
    out = tmp_path / "figures.json"
    cmd = [sys.executable, str(REPO_ROOT / "bench" / "alert_rules_fleet.py"), "--targets", "3", "--sims", "1"]
    cmd += ["--window", WINDOW, "--for", FOR, "--readings", "3", "--json", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO_ROOT, timeout=180, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    print(done.stdout)
    figures = json.loads(out.read_text())
    assert figures["targets_up"] == 3
    assert set(figures["groups"]) == {"llmdiag-vllm-recording", "llmdiag-vllm-alerts"}, figures["groups"]
    for name, group in figures["groups"].items():
        assert group["rules"] > 0, name
        assert group["interval_seconds"] == 1.0, name
        # the window and the for: passed before the readings: at least that many evaluations, each timed
        assert group["iterations"] >= WINDOW_SECONDS + FOR_SECONDS, (name, group)
        assert 0 < group["longest_duration_seconds"] < group["interval_seconds"], (name, group)
        assert group["within_interval"], (name, group)
    assert done.stdout.count("within one interval: yes") == len(figures["groups"]), done.stdout
