"""The embedded engine: iteration-level ("in-flight") scheduling of generation requests on one thread.

Every iteration of the engine thread:
1. admits queued sequences up to `max_active` (new ones join between steps, finished ones leave);
2. ends sequences that were cancelled (`cancel(request_id)` or their `is_cancelled()` callable, called
   every iteration; the model's callable asks Triton at most at embedded_engine.cancellation's rate, so a client
   disconnect stops the work within that period; its KV cache is parked for reuse);
3. advances every active sequence by one step: the prefill (prompt, plus draft tokens if any) for a new
   sequence, otherwise one decode step. So concurrent requests make progress together, one token each per
   iteration. Forward passes are per sequence (own HF DynamicCache), not batched.

KV-cache reuse (embedded_engine.prefix_cache): a sequence that ends normally or by cancellation parks its cache;
a new request whose prompt continues a parked sequence takes it and prefills only the new tokens (skipped
for requests that want context logits, which need the whole prompt run).

LoRA (embedded_engine.lora, lora_layers): a request's adapter was resolved when it was parsed; each of its forward
passes runs with that adapter in the model's LoraSlot, so sequences of one iteration may each use another adapter,
or none.

Events go to each sequence's `on_event` callback, always from the engine thread, in order, ending with
exactly one event with `finished=True` (also on errors, cancellation and shutdown). A failure in one
sequence (model error, callback error) ends only that sequence.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from bls.errors import Unavailable
from bls.finish_reason import FinishReason
from embedded_engine.draft_verification import accept_tokens
from embedded_engine.lora import LoraCache, LoraLayout, prefetch
from embedded_engine.lora_layers import LoraSlot, install_lora
from embedded_engine.ngram import NGramDrafting
from embedded_engine.prefix_cache import PrefixCache, PrefixCacheLimits
from embedded_engine.request import EngineLimits, GenerationRequest
from embedded_engine.sampling import TokenSampler
from embedded_engine.settings import DEFAULT_MAX_ACTIVE_REQUESTS, DEFAULT_MAX_QUEUED_REQUESTS, EngineSettings
from embedded_engine.stopping import StopCriteria

log = logging.getLogger(__name__)


class ModelRunner(Protocol):
    """What the scheduler needs from a model: a KV cache per sequence and a forward over new tokens."""

    vocab_size: int

    def new_cache(self) -> Any: ...

    def forward(self, cache: Any, token_ids: Sequence[int], past_length: int, num_logits: int) -> torch.Tensor:
        """Run `token_ids` (positions past_length...) through the model, extending `cache`; return the
        fp32 logits of the last `num_logits` positions, [num_logits, vocab]."""
        ...

    def crop(self, cache: Any, length: int) -> None:
        """Forget cache entries from position `length` on (rejected draft tokens)."""
        ...


class HFModelRunner:
    """A transformers causal LM (LlamaForCausalLM) with one DynamicCache per sequence."""

    def __init__(self, model: Any):
        from transformers import DynamicCache

        self._model = model
        self._new_cache = DynamicCache
        self.vocab_size: int = model.config.vocab_size

    def new_cache(self) -> Any:
        return self._new_cache()

    def forward(self, cache: Any, token_ids: Sequence[int], past_length: int, num_logits: int) -> torch.Tensor:
        input_ids = torch.tensor([list(token_ids)], dtype=torch.long)
        positions = torch.arange(past_length, past_length + len(token_ids))
        with torch.no_grad():
            output = self._model(
                input_ids=input_ids,
                past_key_values=cache,
                use_cache=True,
                cache_position=positions,
                position_ids=positions.unsqueeze(0),
                logits_to_keep=num_logits,  # skips the vocabulary projection of the rest of the prompt
            )
        return output.logits[0].float()

    def crop(self, cache: Any, length: int) -> None:
        cache.crop(length)


@dataclass
class EngineEvent:
    request: GenerationRequest
    token_ids: list[int] = field(default_factory=list)  # new tokens of this step
    log_probs: list[float] = field(default_factory=list)  # one per new token, if return_log_probs
    context_logits: np.ndarray | None = None  # [prompt_len, vocab], first event, if asked for
    generation_logits: np.ndarray | None = None  # [len(token_ids), vocab], raw model logits, if asked for
    drafted_tokens: int = 0  # draft tokens this step verified (external ones, or n-gram drafts)
    accepted_draft_tokens: int = 0
    finished: bool = False
    finish_reason: FinishReason | None = None
    error: BaseException | None = None
    time_ns: int = field(default_factory=time.time_ns)  # when the engine produced it (perf metrics)
    scheduled_ns: int | None = None  # first event of a sequence: when its prefill started
    reused_tokens: int = 0  # first event: prompt tokens whose KV cache was reused from an earlier request


EventCallback = Callable[[EngineEvent], None]


@dataclass(frozen=True)
class IterationStats:
    """What one engine iteration did and what it holds after it, in the terms of TensorRT-LLM's executor
    IterationStats, which its Triton backend exports as the nv_trt_llm_* metrics (embedded_engine.metrics).

    KV cache: each sequence has its own contiguous cache here, so blocks are nominal: a sequence holding n tokens
    uses ceil(n / TOKENS_PER_KV_BLOCK) blocks, and capacity is max_active sequences of max_seq_len tokens."""

    iteration: int
    timestamp_ns: int
    active: int  # sequences admitted and not finished
    max_active: int
    scheduled: int  # sequences advanced by this iteration (prefill or decode)
    context: int  # of those, prefills
    waiting: int  # queued for a slot
    context_tokens: int  # prompt tokens run by this iteration's prefills (reused ones excluded)
    kv_blocks_used: int
    kv_blocks_max: int
    kv_blocks_reused: int  # blocks this iteration's prefills took from parked caches


TOKENS_PER_KV_BLOCK = 32  # TensorRT-LLM's default tokens_per_block
IterationCallback = Callable[[IterationStats], None]


def kv_blocks(tokens: int) -> int:
    return -(-tokens // TOKENS_PER_KV_BLOCK)


class EngineShutDown(Unavailable):
    """The engine is unloading or unloaded."""


class EngineAtCapacity(Unavailable):
    """max_active sequences run and max_queued wait: the request is refused at once, never queued unbounded."""


class EngineFailed(Unavailable):
    """The engine thread died; every request fails at once until the model is reloaded."""


@dataclass(eq=False)
class _Sequence:
    request: GenerationRequest
    on_event: EventCallback
    is_cancelled: Callable[[], bool]
    tokens: list[int]  # prompt + generated, extended in place
    stop: StopCriteria
    sampler: TokenSampler | None = None
    cache: Any = None  # None until the prefill ran
    cached: int = 0  # leading `tokens` whose KV `cache` holds (it may hold more: rejected draft tokens)
    cancel_requested: bool = False
    done: bool = False


class Engine:
    def __init__(
        self,
        runner: ModelRunner,
        limits: EngineLimits,
        max_active: int = DEFAULT_MAX_ACTIVE_REQUESTS,
        reuse: PrefixCacheLimits | None = PrefixCacheLimits(),  # None: no KV-cache reuse across requests
        step_s: float = 0.0,  # > 0: every iteration lasts at least this long, like a GPU decoding step
        max_queued: int = DEFAULT_MAX_QUEUED_REQUESTS,  # sequences that may wait for a slot beyond max_active
        # Called before each iteration with the number of active sequences; blocks (bounded) while earlier
        # iterations' responses still wait to be sent (bls.response_loop.ResponseLoop.wait_for_backlog).
        wait_for_sending: Callable[[int], None] | None = None,
        # Held around each iteration's sequence steps: a paced engine hands its responses over when the iteration
        # ends, all at once, as a GPU step's tokens come out together (bls.response_loop.ResponseLoop.held).
        step_scope: Callable[[], AbstractContextManager[None]] = nullcontext,
        # LoRA: the cache requests resolve their adapters in (None: the engine takes no LoRA), and the slot its
        # model's LoRA layers read the adapter of each forward pass from.
        adapters: LoraCache | None = None,
        lora_slot: LoraSlot | None = None,
        # Called on the engine thread after each iteration (metrics); must not block.
        on_iteration: IterationCallback | None = None,
        # Draft tokens from the sequence itself at every decode step (NGram speculative decoding); None: none.
        ngram: NGramDrafting | None = None,
    ):
        if (adapters is None) != (lora_slot is None):
            raise ValueError("adapters and lora_slot go together")
        if runner.vocab_size != limits.vocab_size:
            raise ValueError(f"runner vocab {runner.vocab_size} != limits vocab {limits.vocab_size}")
        self.limits = limits
        self._runner = runner
        self._max_active = max_active
        self._max_queued = max_queued
        self._step_s = step_s
        self._wait_for_sending = wait_for_sending
        self._step_scope = step_scope
        self._on_iteration = on_iteration
        self._ngram = ngram
        self._iterations = 0
        self._context_requests = 0  # this iteration's prefills and their tokens, reset by _report_iteration
        self._context_tokens = 0
        self._reused_tokens = 0
        self.adapters = adapters
        self._lora_slot = lora_slot
        self._failure: BaseException | None = None  # why the engine thread died, if it did
        self._draining = False
        self._prefix_cache = PrefixCache(reuse) if reuse else None
        self._cond = threading.Condition()
        self._waiting: deque[_Sequence] = deque()
        self._active: list[_Sequence] = []
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="embedded-engine", daemon=True)
        self._thread.start()

    def submit(
        self, request: GenerationRequest, on_event: EventCallback, is_cancelled: Callable[[], bool] | None = None
    ) -> None:
        self.submit_batch([request], on_event, is_cancelled)

    def submit_batch(
        self, requests: list[GenerationRequest], on_event: EventCallback, is_cancelled: Callable[[], bool] | None = None
    ) -> None:
        """Queue the rows of one request together, or none of them (Unavailable: at capacity, unloading, failed)."""
        sequences = [
            _Sequence(request, on_event, is_cancelled or (lambda: False), list(request.prompt), request.stop_criteria)
            for request in requests
        ]
        with self._cond:
            if self._failure is not None:
                raise EngineFailed(f"the engine failed ({type(self._failure).__name__}: {self._failure}); "
                                   "reload the model")
            if self._stopping or self._draining:
                raise EngineShutDown("the engine is unloading")
            free_slots = self._max_active - len(self._active)
            if len(self._waiting) + len(sequences) - max(0, free_slots) > self._max_queued:
                raise EngineAtCapacity(
                    f"at capacity: {len(self._active)} sequences running and {len(self._waiting)} waiting "
                    f"(max_active_requests {self._max_active}, max_queued_requests {self._max_queued})")
            self._waiting.extend(sequences)
            self._cond.notify()

    def cancel(self, request_id: str) -> int:
        """Cancel every queued or running sequence of the Triton request `request_id`; returns how many.
        Each ends with a final event, finish_reason "cancelled", at the next iteration."""
        with self._cond:
            matches = [s for s in (*self._waiting, *self._active) if s.request.request_id == request_id and not s.done]
            for sequence in matches:
                sequence.cancel_requested = True
            self._cond.notify()
            return len(matches)

    def load(self) -> tuple[int, int]:
        """(active, queued) sequences that have not finished."""
        with self._cond:
            return sum(not s.done for s in self._active), sum(not s.done for s in self._waiting)

    @property
    def failure(self) -> BaseException | None:
        """Why the engine thread died (None while it runs)."""
        return self._failure

    def drain(self, timeout_s: float) -> bool:
        """Refuse new work and wait up to timeout_s for queued and running sequences to finish; True if they did."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            self._draining = True
            while (self._active or self._waiting) and self._thread.is_alive():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._cond.wait(min(remaining, 0.1))
            return True

    def shutdown(self, timeout_s: float = 30.0) -> None:
        """Stop the thread; sequences still queued or running end with an EngineShutDown error event."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
        self._thread.join(timeout_s)

    # ---- engine thread -----------------------------------------------------------------------------

    def _run(self) -> None:
        """The engine thread. If it dies, every queued and running sequence ends with an EngineFailed error
        and later submits are refused at once: no client waits for an engine that is gone."""
        try:
            self._report_iteration([], counted=False)  # the gauges start at the idle engine's values
            self._loop()
        except BaseException as error:  # recorded, reported to every client, then the thread ends
            log.exception("the engine thread died")
            with self._cond:
                self._failure = error
                remaining = [*self._active, *self._waiting]
                self._active, self._waiting = [], deque()
            for sequence in remaining:
                if not sequence.done:
                    self._finish(sequence, EngineEvent(sequence.request, finished=True, error=EngineFailed(
                        f"the engine failed ({type(error).__name__}: {error}); reload the model")))

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not (self._stopping or self._waiting or self._active):
                    self._cond.wait()
                if self._stopping:
                    break
                while self._waiting and len(self._active) < self._max_active:
                    self._active.append(self._waiting.popleft())
                waiting = list(self._waiting)
                active = list(self._active)
            if self._wait_for_sending is not None:
                self._wait_for_sending(len(active))
            started = time.monotonic()
            for sequence in waiting:  # queued requests can be cancelled too
                if self._cancelled(sequence):
                    self._finish_cancelled(sequence)
            with self._step_scope():
                for sequence in active:
                    if self._cancelled(sequence):
                        self._finish_cancelled(sequence)
                    else:
                        self._advance(sequence)
            if self._step_s:
                time.sleep(max(0.0, started + self._step_s - time.monotonic()))
            with self._cond:
                self._active = [s for s in self._active if not s.done]
                self._waiting = deque(s for s in self._waiting if not s.done)
                self._cond.notify_all()  # drain() waits for the engine to empty
            self._report_iteration(active)
        with self._cond:
            remaining = [*self._active, *self._waiting]
            self._active, self._waiting = [], deque()
        for sequence in remaining:
            self._finish(sequence, EngineEvent(sequence.request, finished=True, error=EngineShutDown(
                "the engine shut down before the request finished")))
        if self._prefix_cache is not None:
            self._prefix_cache.clear()

    def _report_iteration(self, stepped: list[_Sequence], counted: bool = True) -> None:
        """IterationStats to on_iteration (engine thread): `stepped` were the iteration's active sequences;
        counted=False: no iteration ran (the report at start)."""
        self._iterations += counted
        context_requests, self._context_requests = self._context_requests, 0
        context_tokens, self._context_tokens = self._context_tokens, 0
        reused_tokens, self._reused_tokens = self._reused_tokens, 0
        if self._on_iteration is None:
            return
        with self._cond:
            active, waiting = list(self._active), len(self._waiting)
        self._on_iteration(IterationStats(
            iteration=self._iterations,
            timestamp_ns=time.time_ns(),
            active=len(active),
            max_active=self._max_active,
            scheduled=len(stepped),
            context=context_requests,
            waiting=waiting,
            context_tokens=context_tokens,
            kv_blocks_used=sum(kv_blocks(s.cached) for s in active),
            kv_blocks_max=self._max_active * kv_blocks(self.limits.max_seq_len),
            kv_blocks_reused=kv_blocks(reused_tokens) if reused_tokens else 0,
        ))

    @staticmethod
    def _cancelled(sequence: _Sequence) -> bool:
        if sequence.cancel_requested:
            return True
        try:
            return bool(sequence.is_cancelled())
        except Exception:  # a broken response sender: nobody is listening any more
            log.exception("is_cancelled() failed for request %r; cancelling it", sequence.request.request_id)
            return True

    def _advance(self, sequence: _Sequence) -> None:
        try:
            event = self._step(sequence)
        except Exception as error:
            log.exception("generation failed for request %r", sequence.request.request_id)
            event = EngineEvent(sequence.request, finished=True, error=error)
        if event.finished:
            self._finish(sequence, event)
        else:
            self._emit(sequence, event)

    def _step(self, sequence: _Sequence) -> EngineEvent:
        request = sequence.request
        prompt_len = len(request.prompt)
        runner = self._runner
        prefill = sequence.cache is None
        scheduled_ns = time.time_ns() if prefill else None
        reused = 0
        if prefill:  # the prompt, with the draft tokens verified in the same forward pass
            sequence.sampler = TokenSampler(
                request.sampling, runner.vocab_size, request.prompt, request.end_id, request.stop_words,
                want_log_probs=request.return_log_probs, guide=request.guide,
            )
            reused = self._take_cache(sequence)
            draft = request.draft_tokens
            feed = [*sequence.tokens[reused:], *draft]
            self._context_requests += 1
            self._context_tokens += len(feed)
            self._reused_tokens += reused
            num_logits = len(feed) if request.return_context_logits else len(draft) + 1
            with self._adapter(request):
                logits = runner.forward(sequence.cache, feed, reused, num_logits)
        else:  # the last token, with the n-gram drafts (if any) verified in the same forward pass
            draft = self._ngram_draft(sequence)
            past = len(sequence.tokens) - 1
            with self._adapter(request):
                logits = runner.forward(sequence.cache, [sequence.tokens[-1], *draft], past, len(draft) + 1)
            sequence.cached = past + 1  # before this step appends; the accepted drafts are added below
        context_logits = None
        if prefill and request.return_context_logits:
            context_logits = logits[:prompt_len].numpy()
            logits = logits[prompt_len - 1 :]
        step = accept_tokens(logits, draft, sequence.sampler, sequence.tokens, prompt_len, sequence.stop)
        # The cache holds what was fed; the tokens go on with the accepted drafts only.
        sequence.cached = (prompt_len if prefill else sequence.cached) + step.accepted_drafts
        if draft and step.finish_reason is None and step.accepted_drafts < len(draft):
            runner.crop(sequence.cache, len(sequence.tokens) - 1)  # the last token is fed next step
        return EngineEvent(
            request,
            token_ids=step.token_ids,
            log_probs=step.log_probs,
            context_logits=context_logits,
            generation_logits=logits[step.rows].numpy() if request.return_generation_logits else None,
            drafted_tokens=len(draft),
            accepted_draft_tokens=step.accepted_drafts,
            finished=step.finish_reason is not None,
            finish_reason=step.finish_reason,
            scheduled_ns=scheduled_ns,
            reused_tokens=reused,
        )

    def _ngram_draft(self, sequence: _Sequence) -> list[int]:
        """N-gram drafts for a decode step (embedded_engine.ngram), within what the sequence may still generate (the
        step's own token is one more) and the engine's max_seq_len; [] without n-gram drafting."""
        if self._ngram is None:
            return []
        request = sequence.request
        generated = len(sequence.tokens) - len(request.prompt)
        room = min(request.max_new_tokens - generated, self.limits.max_seq_len - len(sequence.tokens)) - 1
        return self._ngram.propose(sequence.tokens, room)

    def _adapter(self, request: GenerationRequest) -> AbstractContextManager[None]:
        """The scope of one forward pass of `request`: its LoRA adapter in the model, or the base model."""
        if self._lora_slot is None:
            return nullcontext()
        return self._lora_slot.use(request.lora)

    def _take_cache(self, sequence: _Sequence) -> int:
        """Give a new sequence a cache: a parked one holding a prefix of its prompt if there is one, else an
        empty one. Returns how many prompt tokens the cache already holds."""
        hit = None
        if self._prefix_cache is not None and not sequence.request.return_context_logits:
            hit = self._prefix_cache.take(sequence.tokens, sequence.request.lora_serial)
        if hit is None:
            sequence.cache = self._runner.new_cache()
            return 0
        self._runner.crop(hit.cache, hit.length)
        sequence.cache = hit.cache
        return hit.length

    def _finish_cancelled(self, sequence: _Sequence) -> None:
        self._finish(sequence, EngineEvent(sequence.request, finished=True, finish_reason=FinishReason.CANCELLED))

    def _finish(self, sequence: _Sequence, event: EngineEvent) -> None:
        sequence.done = True
        # An error may have left the cache half-extended: only a cache known to be consistent is parked.
        if self._prefix_cache is not None and sequence.cache is not None and event.error is None:
            self._prefix_cache.put(sequence.tokens[: sequence.cached], sequence.cache, sequence.request.lora_serial)
        sequence.cache = None  # frees (or parks) the KV cache now, not when the bookkeeping drops the sequence
        sequence.sampler = None
        self._emit(sequence, event)

    @staticmethod
    def _emit(sequence: _Sequence, event: EngineEvent) -> None:
        try:
            sequence.on_event(event)
        except Exception:
            log.exception("event callback failed for request %r; cancelling it", sequence.request.request_id)
            sequence.cancel_requested = True


SYNTHETIC_MAX_SEQ_LEN = 8192


def build_engine(settings: EngineSettings, wait_for_sending: Callable[[int], None] | None = None,
                 step_scope: Callable[[], AbstractContextManager[None]] = nullcontext,
                 on_iteration: IterationCallback | None = None) -> Engine:
    """Load the checkpoint (or the synthetic runner) and start the engine thread."""
    runner: ModelRunner
    if settings.synthetic:
        from embedded_engine.synthetic import SyntheticRunner

        runner, model_max_len = SyntheticRunner(), SYNTHETIC_MAX_SEQ_LEN
    else:
        if not settings.checkpoint_dir:
            raise ValueError("the checkpoint_dir model parameter is required unless synthetic is true")
        from embedded_engine.checkpoint import load_checkpoint

        loaded = load_checkpoint(settings.checkpoint_dir)
        runner, model_max_len = HFModelRunner(loaded.model), loaded.max_position_embeddings
    max_seq_len = settings.max_seq_len or model_max_len
    if max_seq_len > model_max_len:
        raise ValueError(f"max_seq_len {max_seq_len} exceeds the model's max_position_embeddings {model_max_len}")
    adapters, lora_slot = None, None
    if settings.lora_target_modules:
        if settings.synthetic:
            raise ValueError("LoRA (lora_target_modules) needs a model: the synthetic runner has none")
        layout = LoraLayout.from_config(loaded.config, settings.lora_target_modules, settings.max_lora_rank)
        lora_slot = install_lora(loaded.model, layout)
        adapters = LoraCache(layout, settings.lora_cache_host_memory_bytes)
        if settings.lora_prefetch_dir:
            task_ids = prefetch(adapters, Path(settings.lora_prefetch_dir))
            log.info("LoRA: prefetched tasks %s from %s", task_ids, settings.lora_prefetch_dir)
    limits = EngineLimits(vocab_size=runner.vocab_size, max_seq_len=max_seq_len, max_draft_len=settings.max_draft_len)
    return Engine(runner, limits, max_active=settings.max_active_requests, step_s=settings.step_ms / 1000,
                  reuse=PrefixCacheLimits() if settings.kv_cache_reuse else None,
                  max_queued=settings.max_queued_requests, wait_for_sending=wait_for_sending, step_scope=step_scope,
                  adapters=adapters, lora_slot=lora_slot, on_iteration=on_iteration, ngram=settings.ngram)
