"""llmdiag.cli.options.flag_groups: option dataclasses as a typer command's parameters."""

from __future__ import annotations

import dataclasses
import inspect
from typing import Annotated

import pytest
import typer
import typer.main

from llmdiag.cli.options import flag_groups, flag_name


@dataclasses.dataclass(frozen=True, kw_only=True)
class Inner:
    depth: Annotated[int, typer.Option("--depth")] = 1


@dataclasses.dataclass(frozen=True, kw_only=True)
class Outer:
    name: Annotated[str, typer.Option("--name")] = "a"
    inner: Inner = dataclasses.field(default_factory=Inner)
    tags: Annotated[list[str] | None, typer.Option("--tag")] = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class Renamed(Outer):
    name: Annotated[str, typer.Option("--name")] = "b"  # a subclass's field keeps its place


def test_the_signature_lists_the_fields_in_place():
    @flag_groups
    def command(
        first: Annotated[str, typer.Argument()], *, outer: Renamed, last: Annotated[bool, typer.Option()] = False
    ) -> tuple[str, Renamed, bool]:
        return first, outer, last

    parameters = inspect.signature(command).parameters
    assert list(parameters) == ["first", "name", "depth", "tags", "last"]
    assert parameters["name"].default == "b" and parameters["depth"].default == 1
    assert parameters["first"].default is inspect.Parameter.empty
    assert command(first="x", name="n", depth=3, tags=["t"], last=True) == (
        "x",
        Renamed(name="n", inner=Inner(depth=3), tags=["t"]),
        True,
    )


def test_typer_parses_into_the_dataclasses():
    app = typer.Typer(add_completion=False)
    seen = []

    @app.command()
    @flag_groups
    def command(*, outer: Outer) -> None:
        """Its docstring is the help."""
        seen.append(outer)

    click_command = typer.main.get_command(app)
    click_command.main(["--name", "z", "--depth", "2", "--tag", "p", "--tag", "q"], standalone_mode=False)
    assert seen == [Outer(name="z", inner=Inner(depth=2), tags=["p", "q"])]
    assert click_command.help == "Its docstring is the help."


def test_an_option_given_twice_is_refused():
    with pytest.raises(TypeError, match="name"):

        @flag_groups
        def command(*, one: Outer, two: Renamed) -> None: ...


def test_flag_names():
    assert flag_name("timeout_seconds") == "--timeout"
    assert flag_name("targets_file") == "--targets"
    assert flag_name("metrics_url") == "--metrics-url"
