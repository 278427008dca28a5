"""Choosing the next token from a row of logits, the way TensorRT-LLM's sampling layers do.

Order of the logits processing (TensorRT-LLM's): embedding_bias, bad words, min_tokens, repetition
penalty, presence/frequency penalties, temperature, then top_k and top_p.

Choices made where TensorRT-LLM leaves room (documented here because clients see them):
- Greedy (argmax) when temperature is 0, when top_k and top_p are both 0, or when top_k is 1.
  Temperature does not change a greedy choice, and is not applied to a greedy request's log-probs.
- The returned log-prob is the log_softmax of the processed logits (after penalties and temperature,
  before the top_k/top_p truncation), i.e. the model's belief after the request's adjustments.
- Without a seed the seed is 0 (TensorRT-LLM's default), so a sampled request is reproducible.
- repetition_penalty follows transformers (divide positive logits, multiply negative ones) over the
  prompt and the output; presence/frequency follow OpenAI (subtract) over the output only.
- min_tokens bans end_id and every token that would complete a stop word until min_tokens tokens
  have been generated; never a guide's stop tokens (a complete document can only end).
- Guided decoding: the grammar's mask comes first (TensorRT-LLM applies its bitmask to the model's logits before
  the sampling layers), so log-probs are those of the grammar-restricted distribution.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from embedded_engine.guided import GUIDE_INPUT, CompiledGuide, GrammarConstraint, GuideDeadEnd
from embedded_engine.stopping import WordList


@dataclass(frozen=True, eq=False)
class SamplingParams:
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int = 0
    min_tokens: int = 0
    bad_words: WordList = field(default_factory=WordList)
    embedding_bias: np.ndarray | None = None  # [vocab] float32

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1 or (self.top_k == 0 and self.top_p == 0.0)


@dataclass(frozen=True)
class SampledToken:
    token_id: int
    log_prob: float | None  # None unless log-probs were asked for


class _TokenIds:
    """A growing set of token ids with a cached index tensor (rebuilt only when a new id appears)."""

    def __init__(self, tokens: Sequence[int] = ()):
        self._ids = dict.fromkeys(tokens)
        self._tensor: torch.Tensor | None = None

    def add(self, token: int) -> None:
        if token not in self._ids:
            self._ids[token] = None
            self._tensor = None

    def __bool__(self) -> bool:
        return bool(self._ids)

    @property
    def tensor(self) -> torch.Tensor:
        if self._tensor is None:
            self._tensor = torch.tensor(list(self._ids), dtype=torch.long)
        return self._tensor


class TokenSampler:
    """The per-sequence sampling state: random generator, token counts for the penalties.

    `choose` must see every token that becomes part of the sequence, in order: it records the token it
    returns, so the next call penalises it. Penalties touch only the ids they concern (gather/scatter),
    so a step costs a few passes over the vocabulary whatever the sequence length.
    """

    NUCLEUS_FIRST_CANDIDATES = 64

    def __init__(
        self,
        params: SamplingParams,
        vocab_size: int,
        prompt: Sequence[int],
        end_id: int | None,
        stop_words: WordList,
        want_log_probs: bool,
        guide: CompiledGuide | None = None,
    ):
        self._params = params
        self._grammar = None if guide is None else GrammarConstraint(guide, vocab_size)
        self._end_id = end_id
        self._stop_words = stop_words
        self._want_log_probs = want_log_probs
        self._num_generated = 0
        bias = params.embedding_bias
        self._bias = None if bias is None else torch.from_numpy(np.asarray(bias, np.float32))
        self._generator = None if params.greedy else torch.Generator().manual_seed(params.seed)
        self._seen = _TokenIds(prompt) if params.repetition_penalty != 1.0 else None
        self._output_ids: _TokenIds | None = None
        self._output_counts: torch.Tensor | None = None
        if params.presence_penalty != 0.0 or params.frequency_penalty != 0.0:
            self._output_ids = _TokenIds()
            self._output_counts = torch.zeros(vocab_size, dtype=torch.float32)

    def choose(self, logits: torch.Tensor, tokens: Sequence[int]) -> SampledToken:
        """Pick the next token. `logits` is the model's [vocab] row (not modified); `tokens` is the
        sequence so far (prompt + generated), used for bad-word and stop-word prefixes."""
        processed = self._process(logits, tokens)
        if self._params.greedy:
            token = int(processed.numpy().argmax())  # numpy's argmax is ~20x faster than torch's on CPU
        else:
            token = self._sample(processed)
        log_prob = None
        if self._want_log_probs:
            log_prob = float(processed[token] - torch.logsumexp(processed, dim=0))
        self._record(token)
        return SampledToken(token, log_prob)

    def _process(self, logits: torch.Tensor, tokens: Sequence[int]) -> torch.Tensor:
        params = self._params
        # Never write into the caller's row (it may be returned as generation_logits): copy on first write.
        logits = logits.float()
        owned = False
        if self._grammar is not None:
            logits, owned = logits.clone(), True
            self._grammar.mask(logits)
        if self._bias is not None:
            logits, owned = logits + self._bias, True
        banned = params.bad_words.completing_tokens(tokens) if params.bad_words else set()
        if self._num_generated < params.min_tokens:
            if self._end_id is not None:
                banned.add(self._end_id)
            if self._stop_words:
                banned |= self._stop_words.completing_tokens(tokens)
            if self._grammar is not None:
                banned -= self._grammar.stop_token_ids
        penalised = banned or self._seen or self._output_ids
        if penalised and not owned:
            logits = logits.clone()
        if banned:
            logits[list(banned)] = float("-inf")
            if self._grammar is not None and not bool(torch.isfinite(logits).any()):
                raise GuideDeadEnd(GUIDE_INPUT, "the request's bad_words_list bans every token the guide allows "
                                   f"after {self._num_generated} tokens")
        if self._seen:
            ids, penalty = self._seen.tensor, params.repetition_penalty
            values = logits[ids]
            logits[ids] = torch.where(values < 0, values * penalty, values / penalty)
        if self._output_ids:
            ids = self._output_ids.tensor
            logits[ids] -= self._output_counts[ids] * params.frequency_penalty + params.presence_penalty
        if not params.greedy and params.temperature != 1.0:
            logits = logits / params.temperature
        return logits

    def _sample(self, logits: torch.Tensor) -> int:
        params = self._params
        probs = torch.softmax(logits, dim=0)
        use_top_p = 0.0 < params.top_p < 1.0
        if params.top_k > 0:
            values, indices = torch.topk(probs, min(params.top_k, probs.numel()))
            values = values / values.sum()  # top_p applies to the renormalised top-k distribution
        elif use_top_p:
            values, indices = self._nucleus_candidates(probs)
        else:
            return int(torch.multinomial(probs, 1, generator=self._generator))
        if use_top_p:
            # Keep the smallest prefix whose mass reaches top_p (the token crossing the threshold stays).
            before = torch.cumsum(values, dim=0) - values
            values = torch.where(before < params.top_p, values, torch.zeros_like(values))
        return int(indices[torch.multinomial(values, 1, generator=self._generator)])

    def _nucleus_candidates(self, probs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The most probable tokens, sorted, enough of them to hold top_p of the mass. Growing a top-k
        avoids sorting the whole vocabulary (milliseconds for Llama 3's 128k) when the nucleus is small."""
        count = min(self.NUCLEUS_FIRST_CANDIDATES, probs.numel())
        while True:
            values, indices = torch.topk(probs, count)
            if count == probs.numel() or float(values.sum()) >= self._params.top_p:
                return values, indices
            count = min(count * 8, probs.numel())

    @property
    def grammar_ended(self) -> bool:
        """A guided sequence's document is complete and its stop token chosen: the sequence ends here."""
        return self._grammar is not None and self._grammar.ended

    def _record(self, token: int) -> None:
        self._num_generated += 1
        if self._grammar is not None:
            self._grammar.accept(token)
        if self._seen is not None:
            self._seen.add(token)
        if self._output_ids is not None:
            self._output_ids.add(token)
            self._output_counts[token] += 1.0
