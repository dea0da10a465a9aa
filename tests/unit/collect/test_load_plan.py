"""`llmdiag load`'s plan, checked before any request: token lengths (fixed, uniform, normal), the bounded levels,
durations and request counts, and load only to this machine unless the user allows another."""

from __future__ import annotations

import asyncio
import random
import statistics

import pytest

from llmdiag.collect.load import (
    MAX_RATE_PER_SECOND,
    MAX_USERS,
    LoadPlan,
    RequestStream,
    TokenLengths,
    plan_of,
    workload_of,
)
from llmdiag.errors import UsageError
from llmdiag.model.workload import Workload


def test_fixed_uniform_and_normal_token_lengths_parse():
    assert TokenLengths.parse(" 256 ", "--prompt-tokens") == TokenLengths(256, 256, text="256")
    assert TokenLengths.parse("128:512", "--prompt-tokens") == TokenLengths(128, 512, text="128:512")
    assert TokenLengths.parse("128-512", "--prompt-tokens").high == 512
    normal = TokenLengths.parse("normal:256,64", "--output-tokens")
    assert (normal.low, normal.high, normal.mean, normal.sd) == (1, 512, 256.0, 64.0)  # high: mean + 4 sd


@pytest.mark.parametrize(
    "text, words",
    [("0", "1 <= low"), ("9:3", "1 <= low"), ("normal:0.5,1", "at least 1"), ("many", "not a token count")],
)
def test_bad_token_lengths_name_the_option_and_say_what_it_takes(text: str, words: str):
    with pytest.raises(UsageError) as info:
        TokenLengths.parse(text, "--prompt-tokens")
    assert "--prompt-tokens" in info.value.message and words in info.value.message
    assert "128:512" in info.value.hint


def test_samples_stay_in_range_and_follow_the_distribution():
    rng = random.Random(7)
    assert {TokenLengths(256, 256).sample(rng) for _ in range(50)} == {256}
    uniform = [TokenLengths(10, 20).sample(rng) for _ in range(2000)]
    assert min(uniform) == 10 and max(uniform) == 20  # both ends reachable
    normal = TokenLengths.parse("normal:100,10", "x")
    draws = [normal.sample(rng) for _ in range(4000)]
    assert all(1 <= d <= 140 for d in draws)
    assert statistics.mean(draws) == pytest.approx(100, abs=1.0) and statistics.stdev(draws) == pytest.approx(
        10, rel=0.1
    )
    assert all(TokenLengths.parse("normal:2,50", "x").sample(rng) >= 1 for _ in range(200))  # clipped at 1


@pytest.mark.parametrize(
    "plan, words",
    [
        (LoadPlan(levels=[]), "no load level"),
        (LoadPlan(levels=[0]), "whole numbers"),
        (LoadPlan(levels=[2.5]), "whole numbers"),
        (LoadPlan(levels=[MAX_USERS + 1]), "whole numbers"),
        (LoadPlan(levels=[0.0], mode="open"), "rates must be above 0"),
        (LoadPlan(levels=[MAX_RATE_PER_SECOND + 1], mode="open"), "rates must be above 0"),
        (LoadPlan(levels=[4], duration_seconds=0.5), "duration_seconds"),
        (LoadPlan(levels=[4], duration_seconds=601), "duration_seconds"),
        (LoadPlan(levels=[4], max_requests=0), "max_requests"),
    ],
)
def test_levels_durations_and_request_counts_are_bounded(plan: LoadPlan, words: str):
    with pytest.raises(UsageError, match=words):
        plan.validate_levels()


def test_the_bounds_themselves_are_allowed():
    LoadPlan(levels=[1, MAX_USERS], duration_seconds=600).validate_levels()
    LoadPlan(levels=[0.1, MAX_RATE_PER_SECOND], mode="open", duration_seconds=1).validate_levels()


def test_load_goes_to_this_machine_unless_another_is_allowed():
    LoadPlan(levels=[1]).validate("http://127.0.0.1:8000")
    LoadPlan(levels=[1]).validate("http://localhost:8000")
    with pytest.raises(UsageError) as info:
        LoadPlan(levels=[1]).validate("http://user:secret@10.1.2.3:8000")
    assert "not this machine" in info.value.message and "secret" not in info.value.message
    assert "allow" in info.value.hint
    LoadPlan(levels=[1], allow_remote=True).validate("http://10.1.2.3:8000")


# --- a recorded workload replays the same requests ------------------------------------------------------------


async def draws(plan: LoadPlan, level: float, count: int) -> list[tuple[str, int]]:
    stream = RequestStream(plan, level, None)
    return [((r := await stream()).prompt, r.max_tokens) for _ in range(count)]


def test_a_saved_workload_replays_the_same_prompts_and_lengths_in_order():
    plan = LoadPlan(
        levels=[4],
        prompt_tokens=TokenLengths.parse("16:64", "p"),
        output_tokens=TokenLengths.parse("normal:32,8", "o"),
        seed=11,
        think_time_seconds=0.5,
    )
    recorded = workload_of(plan, slo_ttft_seconds=None, slo_tpot_seconds=0.05)
    replay = plan_of(Workload.model_validate_json(recorded.model_dump_json()), timeout_seconds=5, allow_remote=False)
    assert (replay.seed, replay.levels, replay.think_time_seconds) == (11, [4], 0.5)
    assert (replay.prompt_tokens, replay.output_tokens) == (plan.prompt_tokens, plan.output_tokens)
    first, again = asyncio.run(draws(plan, 4, 50)), asyncio.run(draws(replay, 4, 50))
    assert first == again
    assert len({tokens for _, tokens in first}) > 5  # the lengths are drawn, not one value
    assert len({len(prompt.split()) for prompt, _ in first}) > 5
    # another seed, or another level of the same workload, draws other requests
    assert asyncio.run(draws(LoadPlan(**{**vars(plan), "seed": 12}), 4, 50)) != first
    assert asyncio.run(draws(plan, 8, 50)) != first
