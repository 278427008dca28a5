"""One choice of a chat or text completion: the BLS request it becomes, and the events its stream turns into.

Every choice streams from tensorrt_llm_bls (also for a non-streamed HTTP response, which is the events collected),
so log probabilities, stop strings and tool calls have one path. `n` choices are `n` BLS requests, run at once.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass, field

import numpy as np

from openai_api.metrics import ApiMetrics, GatheredObservations
from openai_api.stops import StopStrings
from openai_api.tools import ForcedCallStream, may_be_call, parse_calls
from openai_api.triton import TritonBls, scalar, text


@dataclass(frozen=True)
class Sampling:
    """What every choice of a request shares. Temperature and top_p default to OpenAI's documented 1 (the engine's
    own default, without them, is greedy decoding)."""

    max_tokens: int
    stops: list[str]
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logprobs: bool = False
    guide: tuple[str, str | None] | None = None  # (guided_decoding_guide_type, guide)
    top_k: int | None = None
    min_tokens: int | None = None
    ignore_eos: bool = False


@dataclass(frozen=True)
class ToolMode:
    """How a choice's text is read: "auto" (a call if it parses as one, else text), "forced" (the grammar made it a
    call), with the names of the defined tools."""

    kind: str
    names: frozenset[str]


@dataclass
class Delta:
    index: int
    text: str
    logprobs: list[tuple[str, float]] = field(default_factory=list)  # (token text, log prob)


@dataclass
class CallStart:
    """A tool call begins: its position among the choice's calls and its function's name."""

    index: int
    position: int
    name: str


@dataclass
class CallArguments:
    """More of a tool call's arguments (JSON text; the pieces of a call concatenate to its arguments)."""

    index: int
    position: int
    text: str


@dataclass
class End:
    index: int
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int


Event = Delta | CallStart | CallArguments | End


def bls_inputs(prompt: dict[str, np.ndarray], sampling: Sampling, choice: int) -> dict[str, np.ndarray]:
    """The BLS request of one choice. With a seed, choice i samples with seed + i, so the choices differ and each
    is reproducible; without one, each choice draws a random seed (TensorRT-LLM's default seed is the same for every
    request, so unseeded requests would all sample alike)."""
    inputs = dict(prompt)
    inputs["max_tokens"] = scalar(sampling.max_tokens, np.int32)
    inputs["stream"] = scalar(True, bool)
    for name, value in (("temperature", sampling.temperature), ("top_p", sampling.top_p),
                        ("presence_penalty", sampling.presence_penalty),
                        ("frequency_penalty", sampling.frequency_penalty)):
        if value is not None:
            inputs[name] = scalar(value, np.float32)
    seed = secrets.randbits(63) if sampling.seed is None else (sampling.seed + choice) % 2**64
    inputs["seed"] = scalar(seed, np.uint64)
    if sampling.top_k is not None:
        inputs["top_k"] = scalar(sampling.top_k, np.int32)
    if sampling.min_tokens is not None:
        inputs["min_tokens"] = scalar(sampling.min_tokens, np.int32)
    if sampling.ignore_eos:
        inputs["end_id"] = scalar(-1, np.int32)  # the engine's "no end id": no end-of-turn token stops it
    if sampling.stops:
        inputs["stop_words"] = np.array([[s.encode() for s in sampling.stops]], dtype=object)
    if sampling.logprobs:
        inputs["return_log_probs"] = scalar(True, bool)
    if sampling.guide is not None:
        kind, guide = sampling.guide
        inputs["guided_decoding_guide_type"] = text(kind)
        if guide is not None:
            inputs["guided_decoding_guide"] = text(guide)
    return inputs


async def choice_events(bls: TritonBls, inputs: dict[str, np.ndarray], index: int, stops: list[str],
                        tools: ToolMode | None, metrics: ApiMetrics, model: str, arrived: float,
                        ) -> AsyncIterator[Event]:
    """The events of one choice: text deltas (with their tokens' log probabilities), or the tool calls the text
    is, then its End.

    1. Each BLS response's text goes through the stop strings (held back while it may begin one).
    2. tool_choice required / named: the grammar makes the text a call; its name and arguments go out as they are
       generated (ForcedCallStream). auto: text that may be a call (it starts like one) is held to the end and
       parsed there; text that cannot be a call goes out as it comes.
    3. A met stop string ends the text, not the request: the engine stops at the string's tokens, and its final
       response carries the token counts.
    """
    stop = StopStrings(stops)
    forced = ForcedCallStream() if tools is not None and tools.kind == "forced" else None
    holding = tools is not None and forced is None
    held = ""
    held_logprobs: list[tuple[str, float]] = []
    logprobs_sent = 0  # the tokens whose log probs have gone out: a response's output_log_probs covers all so far
    last_text_at = None
    time_to_first_token = metrics.time_to_first_token.labels(model)
    # Every gap observed, gathered per stream and added to the histogram in batches (GatheredObservations).
    inter_token_latency = GatheredObservations(metrics.inter_token_latency.labels(model))
    try:
        async with aclosing(bls.generate(inputs)) as responses:
            async for response in responses:
                if response.text:
                    now = time.monotonic()
                    if last_text_at is None:
                        time_to_first_token.observe(now - arrived)
                    else:
                        inter_token_latency.observe(now - last_text_at)
                    last_text_at = now
                out = stop.push(response.text)
                if response.finish_reason is not None:
                    out += stop.finish()
                logprobs = _token_logprobs(response.text, response.log_probs[logprobs_sent:].tolist())
                logprobs_sent += len(logprobs)
                if forced is not None:
                    held_logprobs += logprobs
                    name, arguments = forced.push(out)
                    if name is not None:
                        yield CallStart(index, 0, name)
                    if arguments:
                        yield CallArguments(index, 0, arguments)
                elif holding:
                    held += out
                    held_logprobs += logprobs
                    if not may_be_call(held):
                        holding = False
                        out, logprobs, held, held_logprobs = held, held_logprobs, "", []
                if forced is None and not holding and (out or logprobs):
                    yield Delta(index, out, logprobs)
                if response.finish_reason is None:
                    continue
                reason = "stop" if stop.stopped else response.finish_reason
                if forced is not None:
                    if forced.name is None:  # cut short before the call's name: what there is, as text
                        yield Delta(index, forced.text, held_logprobs)
                    else:
                        rest = forced.finish()
                        if rest:
                            yield CallArguments(index, 0, rest)
                        if held_logprobs:
                            yield Delta(index, "", held_logprobs)
                        reason = "tool_calls" if reason == "stop" else reason
                elif holding:
                    calls = parse_calls(held, set(tools.names))
                    if calls:
                        for position, call in enumerate(calls):
                            yield CallStart(index, position, call.name)
                            yield CallArguments(index, position, call.arguments)
                        if held_logprobs:
                            yield Delta(index, "", held_logprobs)
                        reason = "tool_calls" if reason == "stop" else reason
                    elif held or held_logprobs:
                        yield Delta(index, held, held_logprobs)
                prompt_tokens, completion_tokens = response.num_input_tokens or 0, response.num_output_tokens or 0
                inter_token_latency.flush()
                metrics.request_duration.labels(model).observe(time.monotonic() - arrived)
                metrics.prompt_tokens.labels(model).inc(prompt_tokens)
                metrics.generation_tokens.labels(model).inc(completion_tokens)
                metrics.finished.labels(model, reason).inc()
                yield End(index, reason, prompt_tokens, completion_tokens)
    finally:  # the client left, a stop string was met, an error: the gaps gathered so far still count
        inter_token_latency.flush()


def _token_logprobs(delta: str, log_probs: list[float]) -> list[tuple[str, float]]:
    """(token text, log prob) for the tokens new in one response (`log_probs`: the tail of its output_log_probs,
    which holds every token generated so far, past those already sent). One token per response is the rule (the
    engine streams each token); where the server merged several into one response, their text cannot be told apart
    and goes with the last of them."""
    if not log_probs:
        return []
    return [("", lp) for lp in log_probs[:-1]] + [(delta, log_probs[-1])]


async def merged(streams: list[AsyncIterator[Event]]) -> AsyncIterator[Event]:
    """The events of several choices as they come. Leaving early cancels every choice (and so its BLS request)."""
    if len(streams) == 1:
        async with aclosing(streams[0]) as only:
            async for event in only:
                yield event
        return
    queue: asyncio.Queue = asyncio.Queue()
    done = object()

    async def pump(stream: AsyncIterator[Event]) -> None:
        try:
            async with aclosing(stream) as events:
                async for event in events:
                    queue.put_nowait(event)
            queue.put_nowait(done)
        except Exception as error:  # noqa: BLE001 - handed to the consumer, which raises it
            queue.put_nowait(error)

    tasks = [asyncio.create_task(pump(stream)) for stream in streams]
    try:
        remaining = len(tasks)
        while remaining:
            item = await queue.get()
            if item is done:
                remaining -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
