"""The HTML report, opened in a real headless Chromium from a file URL.

What it must do: draw its charts, log no console error, make no request beyond its own file (GPU clusters are
often air-gapped), run nothing a server wrote, and never carry a credential. Screenshots land in
test-output/browser/.
"""

from __future__ import annotations

import json
import re
import threading
from pathlib import Path

import pytest

from llmdiag.model import LoadPoint, LoadReport, Percentiles, Verdict
from llmdiag.render.html import render_html
from tests.conftest import run_cli
from tests.e2e.test_bad_input import assert_clean_error
from tests.support import browser
from tests.support.httpserver import Reply, ScriptedServer

SCAN_CHARTS = ("requests", "kv", "preemptions", "tokens", "gpu_util", "gpu_memory", "ttft", "itl")
SWEEP_CHARTS = ("sweep_ttft", "sweep_itl", "sweep_total", "sweep_per_user", "sweep_goodput", "sweep_errors")
MAX_REPORT_BYTES = 400 * 1024

PAINTED_PIXELS = """(id) => {
  const canvas = document.querySelector('#chart-' + id + ' canvas');
  if (!canvas) return 0;
  const data = canvas.getContext('2d').getImageData(0, 0, canvas.width, canvas.height).data;
  let painted = 0;
  for (let i = 3; i < data.length; i += 4) if (data[i] > 0) painted++;
  return painted;
}"""


def assert_clean_visit(visit: browser.PageVisit, path: Path) -> None:
    assert visit.console_errors == [], visit.console_errors
    assert visit.page_errors == [], visit.page_errors
    assert visit.dialogs == [], visit.dialogs
    assert visit.requests == [path.resolve().as_uri()], f"requests beyond the file itself: {visit.requests}"
    assert visit.failed_requests == []


def assert_charts_drawn(visit: browser.PageVisit, ids: tuple[str, ...]) -> None:
    page = visit.page
    assert page.locator("[data-unavailable]").count() == 0, page.locator("[data-unavailable]").all_inner_texts()
    for chart_id in ids:
        box = page.locator(f"#chart-{chart_id}")
        assert box.get_attribute("data-rendered") == "1", chart_id
        assert box.locator("canvas").count() == 1, chart_id
        assert page.evaluate(PAINTED_PIXELS, chart_id) > 500, f"chart {chart_id} drew (almost) nothing"
    assert page.get_attribute("body", "data-charts-rendered") == str(len(ids))


# ---------------------------------------------------------------------------------------------
# a scan of the simulator's memory preset


@pytest.fixture(scope="module")
def memory_demo(tmp_path_factory) -> tuple[Path, Path, str]:
    out = tmp_path_factory.mktemp("memory")
    html, result = out / "memory.html", out / "memory.json"
    run = run_cli("demo", "--preset", "memory", "--duration", "6", "-o", str(result), "--html", str(html))
    assert run.returncode == 0, run.stderr
    return html, result, run.stderr


def test_demo_writes_a_report_and_says_where_and_how_big(memory_demo):
    html, _, stderr = memory_demo
    size = html.stat().st_size
    assert 20 * 1024 < size < MAX_REPORT_BYTES, size
    assert re.search(rf"HTML report written to .*memory\.html \({round(size / 1024)} KB\)", stderr), stderr
    text = html.read_text()
    assert "<link" not in text and "src=" not in text and "@import" not in text and "url(" not in text
    assert "default-src 'none'" in text.replace("&#39;", "'")


def test_report_shows_verdict_findings_coverage_and_signals(memory_demo):
    html, result, _ = memory_demo
    verdict = Verdict.model_validate_json(result.read_text())
    text = html.read_text()
    assert verdict.bottleneck.value.upper() in text and "MEMORY-BOUND" in text
    for finding in verdict.findings:
        assert f'id="finding-{finding.code}"' in text
        for item in finding.evidence:
            assert item.source.replace("'", "&#39;").replace(">", "&gt;") in text
    for section in ("What users experience", "Capacity context", "Over the scan window", "Coverage", "Raw signals"):
        assert section in text
    skipped = [r for r in verdict.coverage.rules if r.status == "skipped"]
    assert skipped and all(r.code in text for r in skipped)


def test_report_command_rebuilds_the_same_file_from_the_saved_json(memory_demo, tmp_path):
    html, result, _ = memory_demo
    again = tmp_path / "again.html"
    run = run_cli("report", str(result), "-o", str(again))
    assert run.returncode == 0, run.stderr
    assert again.read_bytes() == html.read_bytes()


def test_memory_report_in_chromium_draws_every_chart_and_fetches_nothing(memory_demo):
    browser.require()
    html, _, _ = memory_demo
    with browser.open_file(html) as visit:
        assert_charts_drawn(visit, SCAN_CHARTS)
        assert_clean_visit(visit, html)
        assert visit.page.locator("details.signals").count() == 1
        assert not visit.page.locator("details.signals table").is_visible()  # collapsed until opened
        visit.page.locator("details.signals summary").click()
        assert visit.page.locator("details.signals table").is_visible()
        assert browser.screenshot(visit, "memory-report").stat().st_size > 10_000


def test_markdown_from_the_saved_result(memory_demo):
    _, result, _ = memory_demo
    run = run_cli("report", str(result), "--markdown")
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("**llmdiag: MEMORY-BOUND**")
    assert "| severity | rule | evidence | value | threshold | source |" in run.stdout


# ---------------------------------------------------------------------------------------------
# hostile strings from the server, and credentials

PWN = "<script>window.__pwned=1</script>"
HOSTILE_VALUES = [
    PWN,
    '"onerror="window.__pwned=2" x="',
    "'><img src=x onerror=window.__pwned=3>",
    "</script><script>window.__pwned=4</script>",
    "{{ 7*7 }} ${7*7} </style><b>bold</b>",
    "A" * 10_000,
]
API_KEY = "sk-SECRET-api-key-9f8e7d"
HEADER_SECRET = "hdr-SECRET-token-1a2b3c"


def label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def hostile_page(n: int) -> bytes:
    """A vLLM page whose label values (model names, engines, config) are hostile; counters grow with ``n``."""
    lines = [
        "# TYPE vllm:num_requests_running gauge",
        "# TYPE vllm:generation_tokens counter",
        "# TYPE vllm:cache_config_info gauge",
    ]
    for index, value in enumerate(HOSTILE_VALUES):
        labels = f'engine="{index}",model_name="{label(value)}"'
        lines.append(f"vllm:num_requests_running{{{labels}}} 2.0")
        lines.append(f"vllm:generation_tokens_total{{{labels}}} {100.0 * n}")
    lines.append(f'vllm:cache_config_info{{block_size="16",evil="{label(PWN)}",num_gpu_blocks="100"}} 1.0')
    lines.append("# TYPE vllm:kv_cache_usage_perc gauge")
    lines.append(f'vllm:kv_cache_usage_perc{{engine="0",model_name="{label(PWN)}"}} 0.5')
    return ("\n".join(lines) + "\n").encode()


class Growing:
    def __init__(self) -> None:
        self.n = 0
        self.lock = threading.Lock()

    def __call__(self, path: str, headers: dict[str, str]) -> Reply:
        with self.lock:
            self.n += 1
            return Reply(body=hostile_page(self.n))


def hostile_load_report(verdict: Verdict) -> LoadReport:
    point = LoadPoint(
        users=4,
        window_seconds=5,
        requests_completed=3,
        errors={PWN: 2, "http 503": 1},
        error_examples=HOSTILE_VALUES[:4],
        ttft_seconds=Percentiles(count=3, p50=0.1, p90=0.2, p99=0.3),
        output_tokens_per_second=100.0,
        verdict=verdict,
    )
    return LoadReport(target=PWN, model=HOSTILE_VALUES[1], points=[point], notes=HOSTILE_VALUES)


def test_hostile_label_values_are_shown_as_text_and_never_run(tmp_path):
    html, md = tmp_path / "hostile.html", tmp_path / "hostile.md"
    with ScriptedServer(Growing()) as server:
        run = run_cli(
            "scan",
            server.url,
            "--duration",
            "2",
            "--no-probe",
            "--no-nvml",
            "--api-key",
            API_KEY,
            "-H",
            f"X-Auth-Token: {HEADER_SECRET}",
            "--html",
            str(html),
            "--json",
            env={"LLMDIAG_API_KEY": API_KEY},
        )
        assert run.returncode in (0, 1), run.stderr
        assert any(h.get("authorization") == f"Bearer {API_KEY}" for _, h in server.requests)  # it was sent …
        md_run = run_cli(
            "scan",
            server.url,
            "--duration",
            "2",
            "--no-probe",
            "--no-nvml",
            "--api-key",
            API_KEY,
            "-H",
            f"X-Auth-Token: {HEADER_SECRET}",
            "--markdown",
        )
        assert md_run.returncode in (0, 1), md_run.stderr
        md.write_text(md_run.stdout)
    verdict = Verdict.model_validate_json(run.stdout)
    assert PWN in verdict.coverage.probes[0].models  # the scan really carried the hostile names
    # … and appears in no output
    for output in (html.read_text(), md_run.stdout, run.stdout, run.stderr, md_run.stderr):
        assert API_KEY not in output and HEADER_SECRET not in output
    text = html.read_text()
    assert PWN not in text and "<img src=x" not in text and 'onerror="window' not in text
    assert "&lt;script&gt;window.__pwned=1&lt;/script&gt;" in text

    # every other server-written field, in a scan report and a load report
    verdict.notes = HOSTILE_VALUES
    verdict.summary = PWN
    verdict.coverage.probes[0].note = HOSTILE_VALUES[2]
    for signal in verdict.signals.values():
        if signal.unavailable:
            signal.unavailable = HOSTILE_VALUES[3]
    pages = {"hostile-scan": verdict, "hostile-load": hostile_load_report(verdict)}
    for name, result in pages.items():
        path = tmp_path / f"{name}.html"
        path.write_text(render_html(result))
        assert PWN not in path.read_text()
    browser.require()
    for name in ("hostile", *pages):
        path = tmp_path / f"{name}.html"
        with browser.open_file(path) as visit:
            assert visit.page.evaluate("typeof window.__pwned") == "undefined"
            assert_clean_visit(visit, path)
            assert visit.page.locator("img, iframe, object, embed").count() == 0
            assert PWN in visit.page.inner_text("body")  # shown, as text
            browser.screenshot(visit, name, full_page=False)  # 10k-character names make a very tall page


# ---------------------------------------------------------------------------------------------
# a load sweep


def test_load_sweep_report_draws_the_sweep(tmp_path):
    html, result = tmp_path / "load.html", tmp_path / "load.json"
    run = run_cli(
        "load",
        "--preset",
        "healthy",
        "--sweep",
        "1,4",
        "--duration",
        "2",
        "--warmup",
        "0.5",
        "--prompt-tokens",
        "64",
        "--output-tokens",
        "32",
        "--slo-ttft",
        "2",
        "-o",
        str(result),
        "--html",
        str(html),
    )
    assert run.returncode == 0, run.stderr
    report = LoadReport.model_validate_json(result.read_text())
    assert [p.users for p in report.points] == [1, 4]
    assert html.stat().st_size < MAX_REPORT_BYTES
    text = html.read_text()
    assert "The server at each level" in text and text.count('class="point-verdict"') == 2
    md = run_cli("report", str(result), "--markdown")
    assert md.returncode == 0 and md.stdout.startswith("**llmdiag load**"), md.stderr
    assert len([line for line in md.stdout.splitlines() if re.match(r"\| (1|4) \|", line)]) == 2
    browser.require()
    with browser.open_file(html) as visit:
        assert_charts_drawn(visit, SWEEP_CHARTS)
        assert_clean_visit(visit, html)
        browser.screenshot(visit, "load-sweep")


def test_load_without_an_slo_says_goodput_is_unavailable(tmp_path):
    report = LoadReport(target="t", points=[LoadPoint(users=1, window_seconds=1, output_tokens_per_second=5.0)])
    text = render_html(report)
    assert "no slo_ttft_seconds or slo_tpot_seconds given" in text  # the CLI: --slo-ttft, --slo-tpot
    specs = json.loads(re.search(r'id="chart-data">(.*?)</script>', text, re.S).group(1))
    assert "sweep_goodput" not in {s["id"] for s in specs}


# ---------------------------------------------------------------------------------------------
# bad input to `llmdiag report`


@pytest.mark.parametrize(
    "content, words",
    [
        (None, "no such file"),
        ("not json {", "not JSON"),
        ("[1, 2]", "not an llmdiag result"),
        ('{"hello": 1}', "not an llmdiag result"),
        ('{"bottleneck": "sideways"}', "not a valid Verdict"),
        ('{"schema_version": "99", "bottleneck": "memory"}', "schema_version"),
    ],
)
def test_report_refuses_what_is_not_a_result(tmp_path, content, words):
    path = tmp_path / "result.json"
    if content is not None:
        path.write_text(content)
    error, _ = assert_clean_error(run_cli("report", str(path), "-o", str(tmp_path / "out.html")))
    assert words in error
    assert not (tmp_path / "out.html").exists()


def test_json_and_markdown_together_is_a_usage_error(tmp_path):
    error, _ = assert_clean_error(run_cli("analyze", str(tmp_path / "x.prom"), "--json", "--markdown"))
    assert "--markdown" in error


# ---------------------------------------------------------------------------------------------
# the committed example


def test_the_committed_example_is_current():
    """reports/examples/ is what the README's command makes: regenerate it when the template changes."""
    from llmdiag.model.io import load_result
    from llmdiag.render.markdown import render_markdown
    from tests.conftest import REPO_ROOT

    examples = REPO_ROOT / "reports" / "examples"
    verdict = load_result(examples / "memory.json")
    assert isinstance(verdict, Verdict) and verdict.bottleneck.value == "memory"
    hint = "regenerate reports/examples with the commands in the README section 'Reports'"
    assert (examples / "memory.html").read_text() == render_html(verdict), hint
    assert (examples / "memory.md").read_text() == render_markdown(verdict), hint


def test_one_dump_draws_what_it_has_and_says_what_it_lacks(tmp_path):
    """analyze of a single recorded vLLM page: gauges are one point; rates and GPU charts are 'unavailable'."""
    from tests.conftest import FIXTURES

    html = tmp_path / "one-dump.html"
    run = run_cli(
        "analyze",
        str(FIXTURES / "vllm-0.32.0" / "memory" / "scrape-06.prom"),
        "--html",
        str(html),
        "--fail-on",
        "never",
    )
    assert run.returncode == 0, run.stderr
    text = html.read_text()
    assert 'id="chart-preemptions"' not in text and 'id="chart-gpu_util"' not in text
    missing = re.findall(r'data-unavailable="1">([^<]*)<', text)
    assert len(missing) == 4 and all(m.startswith("unavailable: ") for m in missing), missing
    assert "one scrape has no interval" in text and "no GPU telemetry in this result" in text
    browser.require()
    with browser.open_file(html) as visit:
        assert_clean_visit(visit, html)
        drawn = visit.page.locator("[data-rendered='1']").count()
        assert drawn == visit.page.locator(".chart").count() == 4  # requests, KV, TTFT, ITL


def test_an_unwritable_html_path_is_one_clean_error(tmp_path):
    from tests.conftest import FIXTURES

    dump = FIXTURES / "vllm-0.32.0" / "memory" / "scrape-06.prom"
    error, hint = assert_clean_error(run_cli("analyze", str(dump), "--html", str(tmp_path / "no" / "such" / "r.html")))
    assert "cannot write" in error and "--html" in hint
