"""The exported alerting rules at fleet scale: one real Prometheus (Debian's) loads `llmdiag rules export`'s file and
scrapes 50 simulated vLLM targets; does each llmdiag rule group evaluate within one evaluation interval?

The targets are cheap as in bench/check_fleet200.py: ``--sims`` simulator processes (``llmdiag sim serve --load``,
the presets in turn: healthy, memory, compute, scheduling, network), each scraped as ``targets / sims`` targets under
its own ``pod`` label, so that Prometheus holds, and the rules read, one set of series per target (50 by default),
with its simulated dcgm-exporter page under the same label (the export's DCGM rules join the two by pod).
Scrapes and rule evaluations every ``--interval`` seconds (1 s: fifteen times as often as Prometheus's usual 15 s).
The export's window defaults to 20 s: at a 1 s scrape it holds 20 samples per series, as the export's default 5 m
window does at a 15 s scrape, so each range selection reads as many samples as in production.

After the window and the ``for:`` have passed, Prometheus's own metrics (its /metrics page) are read once a second
for ``--readings`` seconds. Printed per llmdiag group: its rules, its interval
(``prometheus_rule_group_interval_seconds``), the longest and the last evaluation seen
(``prometheus_rule_group_last_duration_seconds``), the evaluations done and missed
(``prometheus_rule_group_iterations_total``, ``..._iterations_missed_total``), and whether it evaluates within one
interval (the longest evaluation seen below the interval, none missed); and its three slowest rules at the last
evaluation (/api/v1/rules' evaluationTime). Prints, asserts nothing, exits 0 like the
other benches (tests/e2e/test_alert_rules_live.py runs it at 3 targets and asserts the figures are there).

    .venv/bin/python bench/alert_rules_fleet.py                 # 50 targets, 5 simulators, 1 s interval
    .venv/bin/python bench/alert_rules_fleet.py --targets 3 --sims 1 --readings 3 --json out.json
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
import urllib.request
from contextlib import ExitStack
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:  # run as a script: bench/ and tests/ import as packages
    sys.path.insert(0, str(REPO_ROOT))

from bench.sim_process import SimProcess  # noqa: E402
from llmdiag.sim.presets import PRESETS  # noqa: E402
from tests.support.prometheus_server import PrometheusServer  # noqa: E402

GROUP_METRICS = (
    "prometheus_rule_group_interval_seconds",
    "prometheus_rule_group_last_duration_seconds",
    "prometheus_rule_group_iterations_total",
    "prometheus_rule_group_iterations_missed_total",
    "prometheus_rule_group_rules",
)
# `name{rule_group="FILE;GROUP"} VALUE`: Prometheus labels a group's series with its file and name
LINE = re.compile(r'^(?P<name>\w+)\{rule_group="[^";]*;(?P<group>[^"]+)"\} (?P<value>\S+)$')


def own_metrics(prom_url: str) -> str:
    """Prometheus's own /metrics page (it does not scrape itself here)."""
    with urllib.request.urlopen(f"{prom_url}/metrics", timeout=10) as response:
        return response.read().decode()


def head_series(text: str) -> int | None:
    found = re.search(r"^prometheus_tsdb_head_series (\S+)$", text, re.M)
    return int(float(found[1])) if found else None


def group_figures(text: str) -> dict[str, dict[str, float]]:
    """The rule-group metrics of Prometheus's own /metrics page, per llmdiag group name."""
    figures: dict[str, dict[str, float]] = {}
    for line in text.splitlines():
        found = LINE.match(line)
        if found and found["name"] in GROUP_METRICS and found["group"].startswith("llmdiag-"):
            figures.setdefault(found["group"], {})[found["name"]] = float(found["value"])
    return figures


def slowest_rules(prom_url: str, count: int = 3) -> dict[str, list[tuple[str, float]]]:
    """Per llmdiag group, its ``count`` slowest rules at their last evaluation (/api/v1/rules' evaluationTime)."""
    with urllib.request.urlopen(f"{prom_url}/api/v1/rules", timeout=10) as response:
        groups = json.loads(response.read())["data"]["groups"]
    slowest = {}
    for group in groups:
        if group["name"].startswith("llmdiag-"):
            timed = [
                (
                    r.get("name", "") + (f"{{code={r['labels']['code']}}}" if "code" in r.get("labels", {}) else ""),
                    float(r.get("evaluationTime", 0.0)),
                )
                for r in group["rules"]
            ]
            slowest[group["name"]] = sorted(timed, key=lambda t: -t[1])[:count]
    return slowest


def export(server: str, window: str, for_: str, path: Path) -> None:
    """`llmdiag rules export` for ``server``, as a user runs it."""
    cmd = [sys.executable, "-m", "llmdiag", "rules", "export", "--format", "prometheus", "--server", server]
    cmd += ["--window", window, "--for", for_, "-o", str(path)]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO_ROOT, check=False)
    if done.returncode != 0:
        raise SystemExit(f"rules export failed: {done.stderr.strip()}")


def seconds(duration: str) -> float:
    units = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
    found = re.fullmatch(r"(\d+(?:\.\d+)?)(ms|s|m|h)", duration)
    if found is None:
        raise SystemExit(f"not a duration: {duration}")
    return float(found[1]) * units[found[2]]


def measure(args: argparse.Namespace) -> dict:
    """Start the simulators and Prometheus, wait past the window and the for:, read the groups' figures."""
    presets = list(PRESETS)
    with tempfile.TemporaryDirectory(prefix="llmdiag-alert-bench-") as folder, ExitStack() as stack:
        rules = args.rules or Path(folder) / "llmdiag-rules.yml"
        if args.rules is None:
            export(args.server, args.window, args.for_, rules)
        sims = [
            stack.enter_context(SimProcess(presets[i % len(presets)], load=True, dialect=args.dialect))
            for i in range(args.sims)
        ]
        targets = [
            (sims[i % len(sims)].url + args.path, {"pod": f"replica-{i:03d}", "namespace": "llm"})
            for i in range(args.targets)
        ]
        # each target's simulated dcgm-exporter page under its pod label, which the export's DCGM rules join by
        gpus = [(sims[i % len(sims)].url + "/dcgm/metrics", labels) for i, (_, labels) in enumerate(targets)]
        groups = {args.dialect: list(targets), "dcgm": list(gpus)}
        prom = stack.enter_context(PrometheusServer(groups, interval_seconds=args.interval, rule_files=[rules]))
        time.sleep(seconds(args.window) + seconds(args.for_) + 3 * args.interval)
        readings, pages = [], []
        for _ in range(args.readings):
            pages.append(own_metrics(prom.url))
            readings.append(group_figures(pages[-1]))
            time.sleep(args.interval)
        up = prom.query("count(up == 1)")
        slowest = slowest_rules(prom.url)
    groups: dict[str, dict] = {}
    for name in sorted({g for r in readings for g in r}):
        seen = [r[name] for r in readings if name in r]
        last = seen[-1]
        longest = max(s.get("prometheus_rule_group_last_duration_seconds", 0.0) for s in seen)
        interval = last.get("prometheus_rule_group_interval_seconds", args.interval)
        missed = last.get("prometheus_rule_group_iterations_missed_total", 0.0)
        groups[name] = {
            "rules": int(last.get("prometheus_rule_group_rules", 0)),
            "interval_seconds": interval,
            "last_duration_seconds": last.get("prometheus_rule_group_last_duration_seconds"),
            "longest_duration_seconds": longest,
            "iterations": int(last.get("prometheus_rule_group_iterations_total", 0)),
            "iterations_missed": int(missed),
            "within_interval": longest < interval and missed == 0,
            "slowest_rules": slowest.get(name, []),
        }
    return {
        "targets": args.targets,
        "targets_up": int(float(up[0]["value"][1])) if up else 0,
        "simulators": args.sims,
        "dialect": args.dialect,
        "interval_seconds": args.interval,
        "window": args.window,
        "for": args.for_,
        "head_series": head_series(pages[-1]),
        "readings": args.readings,
        "groups": groups,
    }


def report(figures: dict) -> str:
    lines = [
        f"alert rules at fleet scale: {figures['targets']} targets and their DCGM pages ({figures['targets_up']} up) "
        f"from {figures['simulators']} simulators ({figures['dialect']}), scraped and evaluated every "
        f"{figures['interval_seconds']:g} s, window {figures['window']}, for {figures['for']}; "
        f"{figures['head_series']} series in the head; {figures['readings']} readings an interval apart",
    ]
    for name, g in figures["groups"].items():
        lines.append(
            f"  {name:<28} {g['rules']:>3} rules  interval {g['interval_seconds']:g} s  "
            f"longest {g['longest_duration_seconds'] * 1000:.1f} ms  last {g['last_duration_seconds'] * 1000:.1f} ms  "
            f"{g['iterations']} evaluations, {g['iterations_missed']} missed  "
            f"within one interval: {'yes' if g['within_interval'] else 'NO'}"
        )
        slow = ", ".join(f"{rule} {seconds * 1000:.1f} ms" for rule, seconds in g["slowest_rules"])
        lines.append(f"    slowest rules at the last evaluation: {slow or '-'}")
    if not figures["groups"]:
        lines.append("  no llmdiag rule group was loaded")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", type=int, default=50)
    parser.add_argument("--sims", type=int, default=5, help="simulator processes (the presets in turn)")
    parser.add_argument("--dialect", default="vllm", help="the simulators' dialect")
    parser.add_argument("--server", default="vllm", help="the export's --server")
    parser.add_argument("--path", default="/metrics", help="the metrics path Prometheus scrapes")
    parser.add_argument("--interval", type=float, default=1.0, help="scrape and evaluation interval, seconds")
    parser.add_argument("--window", default="20s", help="the export's --window")
    parser.add_argument("--for", dest="for_", default="10s", help="the export's --for")
    parser.add_argument("--rules", type=Path, help="load this rules file instead of exporting one")
    parser.add_argument("--readings", type=int, default=10, help="readings of Prometheus's metrics, one per interval")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    if args.targets < 1 or not 1 <= args.sims <= args.targets or args.readings < 1:
        parser.error("need targets >= sims >= 1 and readings >= 1")
    figures = measure(args)
    print(report(figures))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
