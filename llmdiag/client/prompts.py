"""Prompts of a requested token length, from random common words."""

from __future__ import annotations

import asyncio
import random

from llmdiag.client.openai import OpenAIClient
from llmdiag.errors import UsageError

# --- prompts of a chosen length ------------------------------------------------------------------------------

# Common, short English words. Each, with its leading space, is a single token in the vocabularies of the model
# families served most (Llama 2/3, Mistral, Qwen, GPT-2/4): hence the estimate of one token per word.
COMMON_WORDS = tuple(
    """the of and to in is for on that with as by it at from this be or are an not but have has had was were
    will would can could should may might must do does did done make made take took give gave get got go went come
    came see saw know knew think thought say said tell told ask asked work worked call called find found use used
    want need feel leave put mean keep let begin seem help show hear play run move live believe hold bring write
    sit stand lose pay meet include continue set learn change lead understand watch follow stop create speak read
    spend grow open walk win offer remember love consider appear buy wait serve die send expect build stay fall
    cut reach kill remain time year people way day man thing woman life child world school state family student
    group country problem hand part place case week company system program question number night point home water
    room mother area money story fact month lot right study book eye job word business issue side kind head house
    service friend father power hour game line end member law car city name team minute idea kid body information
    back parent face others level office door health person art war history party result change morning reason
    research girl guy moment air teacher force education good new first last long great little own other old big
    high different small large next early young important few public bad same able""".split()  # noqa: SIM905
)
DEFAULT_TOKENS_PER_WORD = 1.0  # see COMMON_WORDS; calibrated against the server's /tokenize where it has one
CALIBRATION_WORDS = 512


class PromptFactory:
    """Prompts of a requested token length from random common words, deterministic for a seed.

    The tokens-per-word ratio is measured once with the server's /tokenize (vLLM) when it has one (the count of a
    long sample minus the count of an empty prompt, which is the special tokens), otherwise
    DEFAULT_TOKENS_PER_WORD. ``prompt()`` then costs no request; ``exact_prompt()`` also checks the result with
    /tokenize and adds or drops words until it is right (a few requests; use it for canaries, not per request of a
    load). Every prompt is a new random draw, so a server's prefix cache cannot serve it.
    """

    def __init__(
        self,
        client: OpenAIClient | None = None,
        *,
        seed: int = 0,
        words: tuple[str, ...] = COMMON_WORDS,
        tokens_per_word: float | None = None,
    ) -> None:
        if not words:
            raise UsageError("PromptFactory needs at least one word")
        self.client = client
        self._rng = random.Random(seed)
        self._words = words
        self.tokens_per_word = tokens_per_word or DEFAULT_TOKENS_PER_WORD
        self.special_tokens = 0  # what the server adds to any prompt (BOS ...), when measured
        self.calibrated_from = "given" if tokens_per_word else "estimate"  # "tokenize" once measured
        self._calibrated = tokens_per_word is not None or client is None
        self._lock: asyncio.Lock | None = None

    def words_for(self, tokens: int) -> int:
        return max(1, round((tokens - self.special_tokens) / self.tokens_per_word))

    def text(self, words: int) -> str:
        choice, pool = self._rng.choice, self._words
        return " ".join(choice(pool) for _ in range(words))

    async def calibrate(self) -> float:
        """Tokens per word, measured with /tokenize once (or the estimate)."""
        if self._calibrated:
            return self.tokens_per_word
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if not self._calibrated and self.client is not None:
                sample = await self.client.count_tokens(self.text(CALIBRATION_WORDS))
                empty = await self.client.count_tokens("") if sample else None
                if sample and empty is not None and sample > empty:
                    self.special_tokens = empty
                    self.tokens_per_word = (sample - empty) / CALIBRATION_WORDS
                    self.calibrated_from = "tokenize"
            self._calibrated = True
        return self.tokens_per_word

    async def prompt(self, tokens: int) -> str:
        """About ``tokens`` tokens (exact on a server whose tokenizer makes each word one token)."""
        if tokens < 1:
            raise UsageError(f"a prompt needs at least one token, got {tokens}")
        await self.calibrate()
        return self.text(self.words_for(tokens))

    async def exact_prompt(self, tokens: int, attempts: int = 4) -> tuple[str, int | None]:
        """A prompt checked with /tokenize: (text, its token count; None where the server cannot count)."""
        words = (await self.prompt(tokens)).split()
        count = None
        for _ in range(attempts):
            count = await self.client.count_tokens(" ".join(words)) if self.client is not None else None
            if count is None or count == tokens:
                break
            missing = round((tokens - count) / self.tokens_per_word) or (1 if tokens > count else -1)
            if missing > 0:
                words += self.text(missing).split()
            else:
                words = words[: max(1, len(words) + missing)]
        return " ".join(words), count
