"""`llmdiag capacity --compare`: the classic comparisons, each a table of alternatives priced by the physics and
measured by the simulator on the same workload."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from llmdiag.model.report import Versioned

# the comparisons, in the order they are run and shown
COMPARISONS = ("batching", "kv", "precision", "priority", "disagg", "users")
CompareName = Literal["batching", "kv", "precision", "priority", "disagg", "users"]
# physics: the closed-form model (llmdiag.physics, llmdiag.engine.capacity); simulator: the built-in simulator's
# engine run in virtual time on the same workload; naive: the seed arithmetic (one stream divided among the users)
Method = Literal["physics", "simulator", "naive"]


class CompareColumn(BaseModel):
    key: str
    label: str
    unit: str  # a unit render.format knows: tokens/s, seconds, ratio, bytes, count


class CompareRow(BaseModel):
    alternative: str
    method: Method
    values: dict[str, float | None]  # by column key; None: this method cannot give it (``unavailable`` says why)
    unavailable: dict[str, str] = Field(default_factory=dict)


class Comparison(BaseModel):
    name: CompareName
    title: str
    question: str  # what the comparison answers, in one line
    columns: list[CompareColumn]
    rows: list[CompareRow]
    chart_columns: list[str]  # the columns the HTML charts draw for each alternative, physics beside the simulator
    finding: str  # what the figures say, in one line (the direction, from the physics and the simulator)
    basis: list[str] = Field(default_factory=list)  # what was assumed


class CompareInputs(BaseModel):
    gpu: str
    model: str
    tp: int
    users: int
    prompt_tokens: int
    output_tokens: int
    max_num_seqs: int
    max_num_batched_tokens: int
    simulated_users: int  # the simulator's closed loop (capped: the users beyond run in no simulation)
    measured_seconds: float  # the simulator's measured window, in virtual seconds (after a warm-up)
    seed: int


class CompareReport(Versioned):
    kind: Literal["compare"] = "compare"
    inputs: CompareInputs
    comparisons: list[Comparison]
