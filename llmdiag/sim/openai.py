"""The OpenAI API as vLLM speaks it, for the simulator: what a request asks for, what it costs in tokens, and
what its answer looks like on the wire (the output text, the SSE events, vLLM's error bodies).

What a request costs the engine:
    prompt tokens   ≈ one per whitespace-separated word of the prompt (or of the chat messages' text), one per
                    id when the prompt is a list of token ids; at least 1. Real BPE tokenizers give ~1.3 tokens
                    per English word; the simulator keeps the estimate simple so that a load generator can aim at
                    a prompt length by counting words.
    output tokens   ``max_tokens`` (``max_completion_tokens`` for chat; ``default_max_tokens`` when absent), finish
                    reason "length". When the config sets ``stop_after_tokens`` (a model that says EOS there) and
                    the request does not set ``ignore_eos``, the output stops at max(min_tokens, stop_after_tokens)
                    with reason "stop" if that comes first (``llmdiag.sim.app`` settles the sizes).
    rejections      when --max-num-queued-reqs is reached: HTTP 503 with vLLM's message (``BUSY_MESSAGE``).

The output text is a fixed cycle of plain words (``WORDS``), so it goes into JSON without escaping.
"""

from __future__ import annotations

import itertools
import json
import time
import zlib
from typing import Any, cast

from aiohttp import web

BUSY_MESSAGE = (
    "The engine is currently busy and cannot accept new requests. Please try again later or on a different instance."
)
VOCABULARY_SIZE = 32_000  # /tokenize's ids: a hash of each word (the engine needs only counts)
WORDS = (
    "the",
    "model",
    "answers",
    "with",
    "plain",
    "words",
    "so",
    "that",
    "every",
    "token",
    "is",
    "one",
    "word",
    "and",
    "nothing",
    "needs",
    "escaping",
    "in",
    "json",
)


class BadRequest(Exception):
    """A request the OpenAI API would refuse with HTTP 400."""


class OutputText:
    """The output text: token i is " " + WORDS[i % len(WORDS)]; slices by token index, no per-token objects."""

    def __init__(self, tokens: int) -> None:
        pieces = [" " + WORDS[i % len(WORDS)] for i in range(tokens)]
        self.offsets = [0, *itertools.accumulate(len(p) for p in pieces)]
        self.text = "".join(pieces)

    def span(self, start: int, end: int) -> str:
        return self.text[self.offsets[start] : self.offsets[end]]


def _count_words(text: object) -> int:
    return len(text.split()) if isinstance(text, str) else 0


def completion_prompt_tokens(prompt: object) -> int:
    """The prompt's token estimate: words of a string, ids of a token list; one prompt per request."""
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return max(1, _count_words(prompt))
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return len(prompt)
    if isinstance(prompt, list) and len(prompt) > 1:
        raise BadRequest("the simulator serves one prompt per request")
    raise BadRequest("'prompt' must be a string or a list of token ids")


def chat_prompt_tokens(messages: object) -> int:
    """Words of every message's text (string content or text parts)."""
    if not isinstance(messages, list) or not messages:
        raise BadRequest("'messages' must be a non-empty list")
    words = 0
    for message in messages:
        if not isinstance(message, dict):
            raise BadRequest("each message must be an object with 'role' and 'content'")
        content = message.get("content")
        if isinstance(content, list):
            words += sum(_count_words(part.get("text")) for part in content if isinstance(part, dict))
        else:
            words += _count_words(content)
    return max(1, words)


def words_of(prompt: object, messages: object) -> list[str]:
    """The words the engine counts: of a completion prompt, or of the chat messages' text."""
    if messages is not None:
        chat_prompt_tokens(messages)  # validates: a non-empty list of objects, else BadRequest
        texts: list[str] = []
        for message in cast("list[dict[str, Any]]", messages):
            content = message.get("content")
            if isinstance(content, list):
                texts += [p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)]
            elif isinstance(content, str):
                texts.append(content)
        return " ".join(texts).split()
    if isinstance(prompt, str):
        return prompt.split()
    raise BadRequest("'prompt' must be a string (or give 'messages')")


def token_id(word: str) -> int:
    return zlib.crc32(word.encode()) % VOCABULARY_SIZE


def int_param(body: dict[str, Any], name: str, minimum: int) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise BadRequest(f"'{name}' must be an integer >= {minimum}, got {value!r}")
    return value


def _error_body(status: int, message: str, kind: str) -> bytes:
    return json.dumps({"error": {"message": message, "type": kind, "param": None, "code": status}}).encode()


def error_response(status: int, message: str, kind: str = "BadRequestError") -> web.Response:
    return web.Response(status=status, body=_error_body(status, message, kind), content_type="application/json")


class SseEvents:
    """vLLM's SSE events for one request. Every event shares a head; the text is plain words from WORDS, so it goes
    in without JSON escaping (the hot path formats strings instead of calling json.dumps per token)."""

    def __init__(self, request_id: str, model_json: str, chat: bool) -> None:
        self.chat = chat
        self.id = f"{'chatcmpl' if chat else 'cmpl'}-{request_id}"
        self.object = "chat.completion.chunk" if chat else "text_completion"
        self.created = int(time.time())
        self.model_json = model_json
        self.head = (
            f'data: {{"id":"{self.id}","object":"{self.object}","created":{self.created},'
            f'"model":{model_json},"choices":[{{"index":0,'
        )

    def role(self) -> bytes:
        delta = '"delta":{"role":"assistant","content":""}'
        return f'{self.head}{delta},"logprobs":null,"finish_reason":null}}]}}\n\n'.encode()

    def tokens(self, text: str, finish_reason: str | None) -> bytes:
        reason = f'"{finish_reason}"' if finish_reason else "null"
        if self.chat:
            delta = f'"delta":{{"content":"{text}"}}'
            return f'{self.head}{delta},"logprobs":null,"finish_reason":{reason}}}]}}\n\n'.encode()
        return (
            f'{self.head}"text":"{text}","logprobs":null,"finish_reason":{reason},"stop_reason":null}}],'
            '"usage":null}\n\n'
        ).encode()

    def usage(self, prompt_tokens: int, completion_tokens: int) -> bytes:
        """The last event with stream_options.include_usage: no choices, the token counts."""
        numbers = {
            "prompt_tokens": prompt_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "completion_tokens": completion_tokens,
        }
        chunk = {
            "id": self.id,
            "object": self.object,
            "created": self.created,
            "model": json.loads(self.model_json),
            "choices": [],
            "usage": numbers,
        }
        return f"data: {json.dumps(chunk, separators=(',', ':'))}\n\n".encode()


async def json_object(request: web.Request) -> dict[str, Any]:
    """The request's JSON object body, or BadRequest in vLLM's words."""
    try:
        body = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise BadRequest("the request body is not valid JSON") from None
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    return body
