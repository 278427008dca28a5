"""Draft-target speculative decoding driven from the BLS (TensorRT-LLM's `draft_tokens_external` mode).

Each round: the draft model proposes k tokens for the current sequence; the target model verifies them
through `draft_input_ids` in one forward pass, keeps the longest prefix it agrees with plus one token of
its own, and (like any request) goes on generating until it has `request_output_len` = k+1 tokens. With
greedy sampling the output is therefore the target's own greedy output.

Cost of a round: the draft runs k decode steps and the target one forward over k+1 tokens. Both are new
engine requests carrying the whole sequence (4 bytes a token); the engines reuse the KV cache of the
previous round's sequence (TensorRT-LLM: enable_kv_cache_reuse; the embedded engine: its prefix cache),
so neither re-runs the prompt. The end of generation is mostly detected without an extra round: a target
that fills to k+1 returns fewer only when it stopped (end_id or a stop word). A target that returns right
after the verification step (j accepted + 1) shows a stop only by returning another count; when it stops
at exactly j + 1 tokens, one more round runs and finds the end (it returns no token). Both engine
behaviours are handled, so the loop does not depend on which one a TensorRT-LLM version has.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from bls.errors import GenerationCancelled
from bls.finish_reason import FinishReason
from bls.token_ids import common_prefix_length
from bls.word_lists import WordList

Tensors = dict[str, np.ndarray]
OUTPUTS = ("output_ids", "sequence_length")
# Target inputs that only make sense for the first round or are decided per round here.
_PER_ROUND = {"input_ids", "input_lengths", "request_output_len", "draft_input_ids", "min_tokens",
              "streaming", "exclude_input_in_output"}
# What the draft gets: it proposes greedily; the target alone decides the output.
_DRAFT_INPUTS = ("end_id", "pad_id", "bad_words_list", "embedding_bias")


class ModelCaller(Protocol):
    def stream(self, model_name: str, inputs: Mapping[str, np.ndarray], outputs: Iterable[str],
               request_id: str = "") -> Iterable[Tensors]: ...


@dataclass
class SpeculationStats:
    draft_tokens: int = 0
    accepted_tokens: int = 0
    rounds: int = 0
    finish_reason: FinishReason = FinishReason.LENGTH

    @property
    def acceptance_rate(self) -> float:
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens else 0.0


class DraftTargetDecoder:
    def __init__(self, models: ModelCaller, target_model: str, draft_model: str):
        self.models = models
        self.target_model = target_model
        self.draft_model = draft_model

    def run(self, engine_inputs: Tensors, num_draft_tokens: int, request_id: str,
            on_tokens: Callable[[list[int], Tensors], bool]) -> SpeculationStats:
        """Generate with drafts; `on_tokens(new_tokens, {})` gets each round's tokens, False = cancelled."""
        sequence = engine_inputs["input_ids"].reshape(-1).tolist()
        max_tokens = int(engine_inputs["request_output_len"].reshape(-1)[0])
        min_tokens = int(engine_inputs["min_tokens"].reshape(-1)[0]) if "min_tokens" in engine_inputs else 0
        stop_words = WordList.from_tensor("stop_words_list", engine_inputs.get("stop_words_list"))
        target_common = {k: v for k, v in engine_inputs.items() if k not in _PER_ROUND}
        draft_common = {k: v for k, v in engine_inputs.items() if k in _DRAFT_INPUTS}
        generated: list[int] = []
        stats = SpeculationStats()

        try:
            while len(generated) < max_tokens:
                k = min(num_draft_tokens, max_tokens - len(generated) - 1)
                draft = (self._call(self.draft_model, draft_common, sequence, k, f"{request_id}-d{stats.rounds}")
                         if k > 0 else [])
                target_inputs = dict(target_common)
                if draft:
                    target_inputs["draft_input_ids"] = np.array([draft], dtype=np.int32)
                if min_tokens > len(generated):
                    target_inputs["min_tokens"] = np.array([[min_tokens - len(generated)]], dtype=np.int32)
                new = self._call(self.target_model, target_inputs, sequence, len(draft) + 1,
                                 f"{request_id}-t{stats.rounds}")

                stats.rounds += 1
                stats.draft_tokens += len(draft)
                accepted = common_prefix_length(draft, new)
                stats.accepted_tokens += accepted
                # Not stopped: k+1 tokens (filled), or exactly the accepted ones plus the target's own.
                engine_stopped = len(new) < len(draft) + 1 and len(new) != min(accepted, len(draft)) + 1
                new, hit_stop_word = stop_words.truncate_after_first(generated, new)
                generated += new
                sequence += new
                if not on_tokens(new, {}):
                    stats.finish_reason = FinishReason.CANCELLED
                    return stats
                if engine_stopped or hit_stop_word:
                    stats.finish_reason = FinishReason.STOP
                    return stats
        except GenerationCancelled:  # the client went away mid-round (RelayedEngineStreams.cancel)
            stats.finish_reason = FinishReason.CANCELLED
            return stats
        stats.finish_reason = FinishReason.LENGTH
        return stats

    def _call(self, model: str, common: Tensors, sequence: list[int], output_len: int, request_id: str) -> list[int]:
        inputs = dict(common)
        inputs["input_ids"] = np.array([sequence], dtype=np.int32)
        inputs["input_lengths"] = np.array([[len(sequence)]], dtype=np.int32)
        inputs["request_output_len"] = np.array([[output_len]], dtype=np.int32)
        inputs["streaming"] = np.array([[False]])
        inputs["exclude_input_in_output"] = np.array([[True]])
        # Engines are decoupled models: even a non-streaming call is read as a stream (of one response).
        tokens: list[int] = []
        for response in self.models.stream(model, inputs, OUTPUTS, request_id):
            tokens += response_tokens(response)
        return tokens


def response_tokens(response: Tensors) -> list[int]:
    """Token ids of one engine response: output_ids [1, beam, len] (beam 0), cut at sequence_length."""
    ids = response.get("output_ids")
    if ids is None or ids.size == 0:
        return []
    ids = ids.reshape(-1, ids.shape[-1])[0]
    length = int(response["sequence_length"].reshape(-1)[0]) if "sequence_length" in response else ids.shape[-1]
    return ids[: min(length, ids.shape[-1])].tolist()
