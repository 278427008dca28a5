"""What tensorrt_llm_bls does for one request: preprocess, generate (plain or speculative), detokenize.

Pure Python over two small interfaces, so it is unit-tested without Triton:
- `ModelCaller`: calls other models (bls.transports picks the topology's: engine streams through the relay, or
  one-response calls in-process);
- `ResponseSink`: sends responses and reports client cancellation (bls.transports: `bls.response_loop.QueuedStream`,
  whose sends return at once and whose responses still waiting to go out absorb later ones (merge_streamed);
  or one stub send for a unary request).

Streaming sends the text added since the previous response (or, with accumulate_tokens, the whole text
so far), produced by an incremental detokenizer: O(1) work per token, and the concatenated deltas are
exactly the non-streamed text.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from bls.batch import BatchInputs, decode_utf8, refuse_deep_json
from bls.contract import ENGINE_TO_TEXT, PREPROCESSING, PREPROCESSING_TO_ENGINE, TEXT_TO_ENGINE, TEXT_TO_PREPROCESSING
from bls.errors import GenerationCancelled, InvalidRequest
from bls.finish_reason import FinishReason
from bls.generation.draft_target import DraftTargetDecoder, SpeculationStats, response_tokens
from bls.response_loop import PER_TOKEN_AXIS, merge_streamed
from bls.text.detokenizer import IncrementalDetokenizer
from bls.word_lists import WordList

Tensors = dict[str, np.ndarray]

MULTIMODAL_INPUTS = ("image_input", "image_bytes_input", "image_url_input", "video_bytes_input")
# What the BLS asks the engine for besides the tokens, by the input that asks for it. Only what the client
# asked for: every requested output costs a lookup and a copy per streamed token. Token counts are not
# asked for: the BLS counts tokens itself (a streamed response's num_output_tokens is the running total).
_OUTPUTS_ASKED_BY = {
    "return_log_probs": ("cum_log_probs", "output_log_probs"),
    "return_context_logits": ("context_logits",),
    "return_generation_logits": ("generation_logits",),
    "return_perf_metrics": tuple(
        name for name in ENGINE_TO_TEXT
        if name.endswith(("_blocks", "_time_ns")) or name in ("acceptance_rate", "total_accepted_draft_tokens",
                                                              "total_draft_tokens")),
}
_GUIDE = "guided_decoding_guide"


class ModelCaller(Protocol):
    """How the BLS calls other models (bls.transports: engine streams through the relay, or in-process)."""

    def infer(self, model_name: str, inputs: Mapping[str, np.ndarray], outputs: Iterable[str],
              request_id: str = "") -> Tensors: ...

    def stream(self, model_name: str, inputs: Mapping[str, np.ndarray], outputs: Iterable[str],
               request_id: str = "") -> Iterable[Tensors]: ...

    def stream_each(self, model_name: str, inputs: Mapping[str, np.ndarray], outputs: Iterable[str],
                    request_id: str, on_response: Callable[[Tensors], bool]) -> bool:
        """`on_response(response)` for each response, possibly on another thread; False from it cancels the
        request. Returns when the stream has ended: False when on_response stopped it. Leaving early (an exception)
        cancels the engine request too."""


class ResponseSink(Protocol):
    def send(self, outputs: Mapping[str, np.ndarray], final: bool = False) -> None: ...

    def is_cancelled(self) -> bool:
        """Asked after every engine response: must be cheap (QueuedStream answers from what it last heard)."""


@dataclass(frozen=True)
class BlsConfig:
    engine_model: str
    preprocessing_model: str
    postprocessing_model: str
    draft_model: str | None
    max_draft_len: int
    accumulate_tokens: bool
    skip_special_tokens: bool
    # The engine's exclude_input_in_output parameter: what a request that does not say gets, as from upstream's
    # ensemble and BLS (the engine's parameter decides).
    exclude_input_in_output: bool
    # Whether this model and the engines stream (Triton's decoupled transaction policy; upstream's
    # decoupled_mode, one setting for the repository). Without it: no `stream`, and the engine is called
    # without streaming, so a client that leaves cannot stop a generation half-way.
    decoupled: bool = True
    # New tokens per streamed response after the first (the stream_interval of TensorRT-LLM's LlmArgs, vLLM
    # and SGLang): a response waits until it carries this many; the final response carries what is left.
    stream_interval: int = 1


@dataclass(frozen=True)
class TextRequest:
    """One tensorrt_llm_bls request, validated. Array values keep their leading batch dimension."""

    request_id: str
    batch_size: int
    stream: bool
    # Streamed responses carry the running num_output_tokens only when the client asked for token counts
    # (return_num_output_tokens, as in NVIDIA's 1.2 BLS): each output of a streamed response is a tensor the
    # Python backend stub serialises, at ~35 µs of CPU each (a one-tensor response costs ~55 µs, two ~90).
    # Final responses always carry both counts.
    stream_token_counts: bool
    exclude_input_in_output: bool
    num_draft_tokens: int
    preprocessing_inputs: Tensors
    engine_inputs: Tensors  # sampling options, already under engine names
    engine_outputs: tuple[str, ...]  # what to ask the engine for

    @classmethod
    def from_inputs(cls, inputs: Mapping[str, np.ndarray], config: BlsConfig, request_id: str) -> TextRequest:
        """`request_id`: unique per request (bls.transports.unique_request_id): child requests are stopped by id."""
        if "max_tokens" not in inputs:
            raise InvalidRequest("max_tokens", "is required")
        if ("text_input" in inputs) == ("messages" in inputs):
            raise InvalidRequest("text_input", "give exactly one of text_input and messages")
        batch_size = int(inputs["max_tokens"].shape[0])
        max_tokens = inputs["max_tokens"].reshape(batch_size, -1)[:, 0]
        if (max_tokens <= 0).any():
            raise InvalidRequest("max_tokens", f"must be > 0, got {int(max_tokens.min())}")

        for name in MULTIMODAL_INPUTS:
            if name in inputs:
                raise InvalidRequest(name, "multimodal input is not supported: this repository serves a text model")
        rows = BatchInputs(inputs, batch_size)
        stream = rows.uniform_scalar("stream", bool, False)
        if stream and not config.decoupled:
            raise InvalidRequest("stream", "needs the model deployed with a decoupled transaction policy "
                                           "(make repo DECOUPLED=true)")
        beam_width = rows.uniform_scalar("beam_width", int, 1)
        if beam_width != 1:
            problem = "streaming needs beam_width 1" if stream else "only beam_width 1 is supported"
            raise InvalidRequest("beam_width", f"{problem}, got {beam_width}")
        if rows.uniform_scalar("use_draft_logits", bool, False):
            raise InvalidRequest("use_draft_logits", "draft logits are not supported; draft tokens are")
        num_draft_tokens = rows.uniform_scalar("num_draft_tokens", int, 0)
        if num_draft_tokens < 0:
            raise InvalidRequest("num_draft_tokens", f"must be >= 0, got {num_draft_tokens}")
        if num_draft_tokens > 0:
            if not config.draft_model:
                raise InvalidRequest("num_draft_tokens", "no draft model is configured for this repository")
            if num_draft_tokens > config.max_draft_len:
                raise InvalidRequest(
                    "num_draft_tokens",
                    f"{num_draft_tokens} exceeds the target engine's max_draft_len {config.max_draft_len}",
                )
            if rows.uniform_scalar("return_context_logits", bool, False) or rows.uniform_scalar(
                    "return_generation_logits", bool, False):
                raise InvalidRequest("num_draft_tokens", "logits outputs are not available with speculative decoding")
            if "guided_decoding_guide_type" in inputs:
                # Each round is a new engine request whose prompt holds the document so far: its grammar would
                # start the document again, and TensorRT-LLM 1.2.1's engine has no input that resumes one.
                raise InvalidRequest("num_draft_tokens", "speculative decoding cannot be combined with guided decoding "
                                                         "(guided_decoding_guide_type): send one or the other")
        for row in range(batch_size):  # a GPU engine's xgrammar would spend seconds on a deep schema (bls.batch)
            if rows.scalar("guided_decoding_guide_type", row, bytes) == b"json_schema" and rows.has(_GUIDE):
                refuse_deep_json(rows.scalar(_GUIDE, row, lambda value: decode_utf8(value, _GUIDE)), _GUIDE)
        asked = [flag for flag in _OUTPUTS_ASKED_BY if rows.uniform_scalar(flag, bool, False)]
        if asked and batch_size > 1 and not stream:
            raise InvalidRequest(asked[0], "with a batch of several prompts needs stream=true (each row's "
                                           "outputs come in its own responses)")

        return cls(
            request_id=request_id,
            batch_size=batch_size,
            stream=stream,
            stream_token_counts=rows.uniform_scalar("return_num_output_tokens", bool, False),
            exclude_input_in_output=rows.uniform_scalar(
                "exclude_input_in_output", bool, config.exclude_input_in_output
            ),
            num_draft_tokens=num_draft_tokens,
            engine_outputs=(
                "output_ids", "sequence_length", *(name for flag in asked for name in _OUTPUTS_ASKED_BY[flag])
            ),
            preprocessing_inputs={pre: inputs[text] for text, pre in TEXT_TO_PREPROCESSING.items() if text in inputs},
            engine_inputs={
                engine: inputs[text]
                for text, engine in TEXT_TO_ENGINE.items()
                if text in inputs and text != "stream"  # the BLS decides how it calls the engine
            },
        )


@dataclass
class RowResult:
    token_ids: list[int] = field(default_factory=list)
    num_input_tokens: int = 0
    finish_reason: FinishReason = FinishReason.STOP
    speculation: SpeculationStats | None = None
    first_token_s: float | None = None  # seconds from arrival (bls.llm_metrics.RequestTiming's clock)
    first_response_tokens: int = 0
    last_token_s: float | None = None
    end_s: float = 0.0  # when generation ended, tokens sent or queued
    stream_tail: str = ""  # streamed text still held back by the detokenizer when generation ended
    details: Tensors = field(default_factory=dict)  # engine outputs for the non-streamed response


@dataclass(frozen=True)
class GenerationObserver:
    """Hooks for metrics; no-ops by default."""

    on_started: Callable[[float], None] = lambda queued_seconds: None  # when serving starts: time it waited
    on_first_token: Callable[[float], None] = lambda seconds: None
    on_finished: Callable[[RowResult], None] = lambda result: None


class _EngineDetails:
    """The engine outputs the final response passes on. Non-streamed: per-token arrays joined, context
    logits from the first response, everything else (cum_log_probs, output_log_probs, perf metrics) from the latest.
    Streamed: the per-response values went out with each token; the final response repeats the latest
    per-request values (perf metrics, cum_log_probs), which clients read from every response; output_log_probs
    went out with each response (NVIDIA's BLS passes each engine response's on unchanged:
    tensorrt_llm_bls/1/lib/triton_decoder.py `_get_response`, `output_log_probs=gen_res.output_log_probs`) and is
    not repeated (the rows of a batch have different lengths). The engine streams every generated token's log
    prob so far in each response (bls.response_loop.PER_TOKEN_AXIS says where upstream does): the latest holds
    them all."""

    def __init__(self, streamed: bool) -> None:
        self._streamed = streamed
        self._latest: Tensors = {}
        self._parts: dict[str, list[np.ndarray]] = {}

    def add(self, outputs: Tensors) -> None:
        for name, value in outputs.items():
            if name in PER_TOKEN_AXIS:
                if not self._streamed:
                    self._parts.setdefault(name, []).append(value)
            elif name == "output_log_probs":
                if not self._streamed:
                    self._latest[name] = value
            elif name != "context_logits":
                self._latest[name] = value
            elif not self._streamed and name not in self._latest:
                self._latest[name] = value

    def tensors(self) -> Tensors:
        joined = {name: np.concatenate(parts, axis=PER_TOKEN_AXIS[name]) for name, parts in self._parts.items()}
        return {**self._latest, **joined}


class TextGenerator:
    """Serves requests on the caller's thread; the rows of a batch run on `row_pool`, one bounded pool for
    every request, or one after another on the caller's thread without one."""

    def __init__(self, config: BlsConfig, models: ModelCaller, tokenizer, observer: GenerationObserver | None = None,
                 row_pool: Executor | None = None):
        self.config = config
        self.models = models
        self.tokenizer = tokenizer
        self.observer = observer or GenerationObserver()
        self._row_pool = row_pool

    def generate(self, request: TextRequest, sink: ResponseSink, arrived: float | None = None) -> None:
        """Serve one request; every response (including the final one) goes through `sink`. `arrived`
        (time.monotonic() when Triton handed the request over) is where time to first token starts."""
        started = time.monotonic() if arrived is None else arrived
        self.observer.on_started(time.monotonic() - started)
        pre = self.models.infer(
            self.config.preprocessing_model, request.preprocessing_inputs,
            [spec.name for spec in PREPROCESSING.outputs], request.request_id,
        )
        rows = range(request.batch_size)
        if request.batch_size == 1 or self._row_pool is None:
            results = [self._generate_row(request, pre, row, sink, started) for row in rows]
        else:
            results = list(self._row_pool.map(lambda row: self._generate_row(request, pre, row, sink, started), rows))
        if request.stream:
            outputs = self._summary(request, results)
            # Per-request values, one row per batch row (each row's engine sent the same outputs).
            for name in results[0].details:
                if all(name in r.details for r in results):
                    outputs[name] = np.concatenate([r.details[name] for r in results])
            sink.send(outputs, final=True)
        else:
            texts = [self._final_text(request, pre, row, result) for row, result in zip(rows, results, strict=True)]
            outputs = self._summary(request, results)
            outputs["text_output"] = _strings(texts)
            if request.batch_size == 1:  # several rows with details are refused in from_inputs
                outputs.update(results[0].details)
            sink.send(outputs, final=True)

    # -- one batch row -----------------------------------------------------------------------------------
    def _generate_row(self, request: TextRequest, pre: Tensors, row: int, sink: ResponseSink,
                      started: float) -> RowResult:
        prompt = _row_prompt(pre, row)
        result = RowResult(num_input_tokens=len(prompt))
        engine_inputs = _row_engine_inputs(request, pre, row)
        streamer = _TextStreamer(self.tokenizer, self.config, request, row) if request.stream else None
        details = _EngineDetails(streamed=request.stream)

        def on_tokens(new_tokens: list[int], extra: Tensors) -> bool:
            """Record tokens, stream them; False when the client has gone away."""
            if new_tokens:
                result.last_token_s = time.monotonic() - started
                if result.first_token_s is None:
                    result.first_token_s = result.last_token_s
                    result.first_response_tokens = len(new_tokens)
                    self.observer.on_first_token(result.first_token_s)
            result.token_ids.extend(new_tokens)
            details.add(extra)
            if streamer is not None:
                outputs = streamer.push(new_tokens, extra)
                if outputs:
                    sink.send(outputs)
            return not sink.is_cancelled()

        if request.num_draft_tokens > 0:
            decoder = DraftTargetDecoder(self.models, self.config.engine_model, self.config.draft_model)
            result.speculation = decoder.run(
                engine_inputs, request.num_draft_tokens, f"{request.request_id}-{row}", on_tokens
            )
            result.finish_reason = result.speculation.finish_reason
        else:
            result.finish_reason = self._stream_engine(request, engine_inputs, f"{request.request_id}-{row}", on_tokens)
        if streamer is not None:
            held = streamer.release()
            if held:
                sink.send(held)
            result.stream_tail = streamer.finish()
        result.details = details.tensors()
        result.end_s = time.monotonic() - started
        self.observer.on_finished(result)
        return result

    def _stream_engine(self, request: TextRequest, engine_inputs: Tensors, child_id: str,
                       on_tokens: Callable[[list[int], Tensors], bool]) -> FinishReason:
        """Plain generation. A streaming engine streams to us, so a cancelled client stops it between tokens (the
        ModelCaller cancels the engine request when we stop reading)."""
        inputs = dict(engine_inputs)
        inputs["streaming"] = np.array([[self.config.decoupled]])
        inputs["exclude_input_in_output"] = np.array([[True]])
        max_tokens = int(inputs["request_output_len"].reshape(-1)[0])
        generated = 0

        def on_response(response: Tensors) -> bool:
            nonlocal generated
            tokens = response_tokens(response)
            generated += len(tokens)
            extra = {ENGINE_TO_TEXT[name]: value for name, value in response.items() if name in ENGINE_TO_TEXT}
            return on_tokens(tokens, extra)

        try:
            # Each response is handled where it is read (for most requests, the thread that reads every engine
            # stream of this process): nothing in on_tokens blocks, sends only queue (bls.response_loop).
            if not self.models.stream_each(self.config.engine_model, inputs, request.engine_outputs, child_id,
                                           on_response):
                return FinishReason.CANCELLED
            return FinishReason.LENGTH if generated >= max_tokens else FinishReason.STOP
        except GenerationCancelled:
            return FinishReason.CANCELLED

    # -- final outputs -----------------------------------------------------------------------------------
    def _final_text(self, request: TextRequest, pre: Tensors, row: int, result: RowResult) -> str:
        """Non-streamed text, from the postprocessing model (the reference decode)."""
        tokens = list(result.token_ids)
        if not request.exclude_input_in_output:
            tokens = _row_prompt(pre, row) + tokens
        post = self.models.infer(self.config.postprocessing_model, {
            "TOKENS_BATCH": np.array([[tokens]], dtype=np.int32).reshape(1, 1, -1),
            "SEQUENCE_LENGTH": np.array([[len(tokens)]], dtype=np.int32),
        }, ["OUTPUT"], request.request_id)
        return post["OUTPUT"].reshape(-1)[0].decode("utf-8")

    def _summary(self, request: TextRequest, results: list[RowResult]) -> Tensors:
        outputs: Tensors = {
            "finish_reason": np.array([[r.finish_reason.reported.value.encode()] for r in results], dtype=object),
            "num_input_tokens": np.array([[r.num_input_tokens] for r in results], dtype=np.int32),
            "num_output_tokens": np.array([[len(r.token_ids)] for r in results], dtype=np.int32),
        }
        if request.stream:
            outputs["text_output"] = _strings([r.stream_tail for r in results])
        if request.num_draft_tokens > 0:
            stats = [r.speculation for r in results]
            outputs["total_draft_tokens"] = np.array([[s.draft_tokens] for s in stats], dtype=np.int32)
            outputs["total_accepted_draft_tokens"] = np.array([[s.accepted_tokens] for s in stats], dtype=np.int32)
            outputs["acceptance_rate"] = np.array([[s.acceptance_rate] for s in stats], dtype=np.float32)
        return outputs


class _TextStreamer:
    """Turns streamed token ids into the text_output of each streamed response. With a stream interval > 1
    (BlsConfig.stream_interval) it holds what it made until the held tokens reach the interval; the first
    response goes at once.

    A stream carries the generated text only, whatever exclude_input_in_output says, as TensorRT-LLM streams
    (its LlmRequest::createResult returns a streaming request's tokens from the last one sent, which starts at
    the prompt's end; NVIDIA's BLS and ensemble stream that, and their clients' --check-outputs expect it)."""

    def __init__(self, tokenizer, config: BlsConfig, request: TextRequest, row: int):
        self._detokenizer = IncrementalDetokenizer(tokenizer, skip_special_tokens=config.skip_special_tokens)
        self._accumulate = config.accumulate_tokens
        self._interval = config.stream_interval
        self._text_so_far = ""
        self._num_tokens = 0
        self._send_counts = request.stream_token_counts
        self._batch_index = np.array([[row]], dtype=np.int32) if request.batch_size > 1 else None
        # Held since the last response: text, tokens, and the engine's other outputs (merged as merge_streamed
        # merges responses).
        self._pending = ""
        self._held_tokens = 0
        self._held_extra: Tensors = {}
        self._sent_any = False

    def push(self, tokens: list[int], extra: Tensors) -> Tensors:
        """The response to send now ({} for none): an engine response's tokens and other outputs."""
        if tokens:
            self._pending += self._detokenizer.push(tokens)
            self._num_tokens += len(tokens)
            self._held_tokens += len(tokens)
        if extra:
            self._held_extra = merge_streamed(self._held_extra, extra, self._accumulate) if self._held_extra \
                else dict(extra)
        if self._interval > 1 and self._sent_any and self._held_tokens < self._interval:
            return {}
        return self.release()

    def release(self) -> Tensors:
        """What is held, as one response ({} when nothing is); at the end of a row it goes before the final."""
        delta, extra, tokens = self._pending, self._held_extra, self._held_tokens
        if not delta and not tokens and not extra:
            return {}
        self._pending, self._held_extra, self._held_tokens = "", {}, 0
        outputs = {"text_output": _strings([self._text(delta)])} if delta or tokens else {}
        if tokens:
            self._sent_any = True
            if self._send_counts:
                # Running count: a response carries several tokens with a stream interval, or when the engine's
                # or this model's sending fell behind (responses waiting to go out are merged: merge_streamed).
                outputs["num_output_tokens"] = np.array([[self._num_tokens]], dtype=np.int32)
        if self._batch_index is not None and (delta or tokens):
            outputs["batch_index"] = self._batch_index
        outputs.update(extra)
        return outputs

    def finish(self) -> str:
        """The text_output of the final response: the held-back tail (or, accumulating, the whole text)."""
        return self._text(self._pending + self._detokenizer.finish())

    def _text(self, delta: str) -> str:
        if not self._accumulate:
            return delta
        self._text_so_far += delta
        return self._text_so_far


def _strings(texts: list[str]) -> np.ndarray:
    """text_output: one string per row, 1-D, as NVIDIA's models send it (its clients read output[0])."""
    return np.array([text.encode() for text in texts], dtype=object)


def _row_prompt(pre: Tensors, row: int) -> list[int]:
    length = int(pre["REQUEST_INPUT_LEN"].reshape(-1)[row])
    return pre["INPUT_ID"][row, :length].tolist()


def _row_engine_inputs(request: TextRequest, pre: Tensors, row: int) -> Tensors:
    """The engine inputs of one batch row (batch 1), from preprocessing's outputs and the request."""
    inputs: Tensors = {}
    for pre_name, engine_name in PREPROCESSING_TO_ENGINE.items():
        if pre_name not in pre:
            continue
        value = pre[pre_name][row : row + 1]
        if pre_name == "INPUT_ID":
            value = value[:, : int(pre["REQUEST_INPUT_LEN"].reshape(-1)[row])]
        elif pre_name in ("STOP_WORDS_IDS", "BAD_WORDS_IDS") and not WordList.from_tensor(engine_name, value):
            continue
        elif pre_name == "EMBEDDING_BIAS" and value.shape[-1] == 0:
            continue
        inputs[engine_name] = value
    for name, value in request.engine_inputs.items():
        inputs[name] = value[row : row + 1] if value.shape[0] == request.batch_size else value
    return inputs

