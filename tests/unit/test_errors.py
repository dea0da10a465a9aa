"""llmdiag.errors: option names in messages follow the caller's spelling (``option``), computed when read; the
default hints the CLI prints are the same words as ever."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

from llmdiag import errors
from llmdiag.cli.options import flag_name
from llmdiag.errors import (
    HistoryError,
    HTTPStatusError,
    NotMetricsError,
    OptionHint,
    ProbeTimeout,
    PrometheusQueryError,
    ResponseTooLargeError,
    UnsupportedServerError,
    option,
    use_option_spelling,
)

PACKAGE = Path(errors.__file__).resolve().parent


@pytest.fixture
def library() -> Iterator[None]:
    previous = use_option_spelling(None)
    yield
    use_option_spelling(previous)


@pytest.fixture
def cli() -> Iterator[None]:
    previous = use_option_spelling(flag_name)
    yield
    use_option_spelling(previous)


def test_the_library_names_an_option_by_its_keyword(library):
    assert option("timeout_seconds") == "timeout_seconds"
    assert ProbeTimeout("no answer").hint == (
        "the server did not answer in time; raise timeout_seconds or check that it is not hung"
    )


def test_the_cli_names_it_by_its_flag(cli):
    assert [option(k) for k in ("timeout_seconds", "headers", "api_key", "max_metrics_bytes", "no_history")] == [
        "--timeout",
        "--header",
        "--api-key",
        "--max-metrics-bytes",
        "--no-history",
    ]


def test_a_hint_is_spelled_when_it_is_read(library):
    error = ResponseTooLargeError("too big")
    assert "max_metrics_bytes" in error.hint
    use_option_spelling(flag_name)
    assert "--max-metrics-bytes" in error.hint and "--max-metrics-bytes" in ResponseTooLargeError.hint


def test_an_explicit_hint_and_a_subclass_hint_win(cli):
    assert ProbeTimeout("x", "do this").hint == "do this"

    class Quiet(NotMetricsError):
        hint = "a fixed hint"

    assert Quiet("x").hint == "a fixed hint"
    assert isinstance(NotMetricsError.__dict__["hint"], OptionHint)


# the hints that name options, as the CLI has always printed them (tests/e2e/golden/bad_input.json pins some)
CLI_HINTS = {
    HistoryError: "check the --history path and its folder's permissions, or pass --no-history",
    ProbeTimeout: "the server did not answer in time; raise --timeout or check that it is not hung",
    NotMetricsError: "point llmdiag at the inference server's base URL, or its metrics page with --metrics-url",
    ResponseTooLargeError: "raise the cap with --max-metrics-bytes if the page really is that large",
    PrometheusQueryError: "check the query by hand with the curl line in the message's signal, "
    "or narrow --selector / the window",
    UnsupportedServerError: "supported: {servers}; if it is one of them, name it with --server NAME (and "
    "--metrics-url if its page is elsewhere)",
}


@pytest.mark.parametrize("cls", list(CLI_HINTS), ids=lambda c: c.__name__)
def test_the_cli_prints_the_same_hints(cli, cls):
    assert cls("message").hint == CLI_HINTS[cls]


def test_http_status_hints(cli):
    assert HTTPStatusError("u", 401).hint == (
        "the server wants credentials: pass --api-key (or LLMDIAG_API_KEY) or --header 'Authorization: …'"
    )
    assert HTTPStatusError("u", 403).hint == "the credentials were refused: check --api-key / --header"
    assert HTTPStatusError("u", 404).hint == (
        "no metrics page there: point at the server's base URL, or give --metrics-url"
    )


def _import_time_calls(tree: ast.AST, inside_function: bool = False) -> Iterator[ast.Call]:
    for node in ast.iter_child_nodes(tree):
        nested = inside_function or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        if not nested and isinstance(node, ast.Call) and getattr(node.func, "id", None) == "option":
            yield node
        yield from _import_time_calls(node, nested)


def test_option_is_never_called_at_import_time():
    # at import time the CLI has not installed its spelling yet: the message would keep the library's
    offenders = [
        f"{path.relative_to(PACKAGE.parent)}:{call.lineno}"
        for path in sorted(PACKAGE.rglob("*.py"))
        for call in _import_time_calls(ast.parse(path.read_text()))
    ]
    assert offenders == []
