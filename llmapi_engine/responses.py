"""The LLM API's RequestOutput -> the tensors of one Triton response, for either request shape.

The LLM API's outputs are CUMULATIVE (CompletionOutput.token_ids / logprobs / text grow with every response;
tensorrt_llm/executor/result.py); the deltas are `token_ids_diff` / `logprobs_diff`.
- C++ backend's contract (as embedded_engine/responses.py and the 1.2.1 backend shape them, beam width 1): streaming,
  one response per LLM response with `output_ids` [1, 1, n] = token_ids_diff (the final one possibly empty);
  unstreamed, one response with every output id, after the prompt unless exclude_input_in_output. sequence_length
  [1, 1]; cum_log_probs [1, 1] and output_log_probs [1, 1, n] (return_log_probs; n: every token so far, from the
  cumulative `logprobs`, in a streamed response too); context_logits [1, prompt, vocab]
  with the first response; generation_logits [1, 1, n, vocab]; batch_index [1, 1] for batch > 1;
  num_input_tokens / num_output_tokens [1, 1] (the latter: tokens this response carries); the perf metrics from
  `request_perf_metrics` (return_perf_metrics).
- NVIDIA's llmapi names (its model.py `_create_response`): `text_output` is the CUMULATIVE text when streaming, as
  NVIDIA's model sends `output.text` in every response (decoded here from the token ids with the repository's
  tokenizer, special tokens skipped; after the prompt's text unless exclude_input_from_output); finish_reason /
  stop_reason as NVIDIA's str() of them (so "None" before the end), cumulative_logprob, and its perf outputs under its
  names (kv_cache_reused_block, kv_cache_missed_block, kv_cache_hit_rate beside the contract's shared ones) in its
  config's dtypes. One string per response: [1, 1].
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import numpy as np

from bls.text.tokenizer import TokenizerBundle
from llmapi_engine.request_mapping import LlmRequest

Tensors = dict[str, np.ndarray]


def nanoseconds(value: Any) -> int:
    """A timing metric in ns: timedelta since the epoch (what NVIDIA's model reads with pd.Timedelta(...).value)."""
    if isinstance(value, timedelta):
        return (value.days * 86_400 + value.seconds) * 1_000_000_000 + value.microseconds * 1_000
    return int(value)


def token_log_prob(entry: Any, token: int) -> float:
    """One output token's log-prob: a {token id: Logprob} (PyTorch flow) or a float."""
    if isinstance(entry, dict):
        return float(entry[token].logprob)
    return float(entry)


class ResponseBuilder:
    """The responses of one LLM request (a batch row of the Triton request)."""

    def __init__(self, request: LlmRequest, tokenizer: TokenizerBundle) -> None:
        self._request = request
        self._tokenizer = tokenizer
        self._sent_context_logits = False

    def build(self, output: Any) -> Tensors | None:
        """The tensors of the response this state of the RequestOutput makes; None when it makes none (unstreamed,
        not finished)."""
        request = self._request
        if not request.streaming and not output.finished:
            return None
        if request.text_api:
            return self._text_api(output)
        return self._contract(output)

    def _contract(self, output: Any) -> Tensors:
        request = self._request
        completion = output.outputs[0]
        # output_log_probs covers every token generated so far, streaming or not (the C++ backend's contract:
        # embedded_engine/responses.py), which is the LLM API's cumulative `logprobs`.
        log_probs = [token_log_prob(e, t) for e, t in zip(completion.logprobs, completion.token_ids, strict=True)] \
            if request.return_log_probs else []
        if request.streaming:
            new_ids = list(completion.token_ids_diff)
            ids = new_ids
        else:
            new_ids = list(completion.token_ids)
            ids = new_ids if request.exclude_input_in_output else [*request.prompt_token_ids, *new_ids]
        tensors: Tensors = {
            "output_ids": np.asarray(ids, np.int32).reshape(1, 1, -1),
            "sequence_length": np.array([[len(ids)]], np.int32),
        }
        if request.return_log_probs:
            tensors["cum_log_probs"] = np.array([[completion.cumulative_logprob or 0.0]], np.float32)
            tensors["output_log_probs"] = np.asarray(log_probs, np.float32).reshape(1, 1, -1)
        if request.sampling.get("return_context_logits") and output.context_logits is not None \
                and not self._sent_context_logits:
            self._sent_context_logits = True
            tensors["context_logits"] = _numpy(output.context_logits)[np.newaxis]
        if request.sampling.get("return_generation_logits"):
            logits = completion.generation_logits
            rows = np.zeros((0, 0), np.float32) if logits is None else _numpy(logits)
            if request.streaming:
                rows = rows[len(rows) - len(new_ids):] if new_ids else rows[:0]
            tensors["generation_logits"] = rows[np.newaxis, np.newaxis]
        if request.batch_size > 1:
            tensors["batch_index"] = np.array([[request.batch_index]], np.int32)
        if request.return_num_input_tokens:
            tensors["num_input_tokens"] = np.array([[len(request.prompt_token_ids)]], np.int32)
        if request.return_num_output_tokens:
            tensors["num_output_tokens"] = np.array([[len(new_ids)]], np.int32)
        if request.sampling.get("return_perf_metrics") and completion.request_perf_metrics is not None:
            tensors.update(self._perf(completion.request_perf_metrics, nvidia_names=False))
        return tensors

    def _text_api(self, output: Any) -> Tensors:
        request = self._request
        completion = output.outputs[0]
        ids = list(completion.token_ids)
        if not request.exclude_input_in_output:
            ids = [*request.prompt_token_ids, *ids]
        tensors: Tensors = {
            "text_output": np.array([[self._tokenizer.decode(ids, skip_special_tokens=True).encode()]], np.object_)}
        if "return_finish_reason" in request.output_switches:
            tensors["finish_reason"] = np.array([[str(completion.finish_reason).encode()]], np.object_)
        if "return_stop_reason" in request.output_switches:
            tensors["stop_reason"] = np.array([[str(completion.stop_reason).encode()]], np.object_)
        if "return_cumulative_logprob" in request.output_switches:
            tensors["cumulative_logprob"] = np.array([[completion.cumulative_logprob or 0.0]], np.float32)
        if request.sampling.get("return_perf_metrics") and completion.request_perf_metrics is not None:
            tensors.update(self._perf(completion.request_perf_metrics, nvidia_names=True))
        return tensors

    @staticmethod
    def _perf(metrics: Any, nvidia_names: bool) -> Tensors:
        kv, timing, spec = metrics.kv_cache_metrics, metrics.timing_metrics, metrics.speculative_decoding
        values: dict[str, tuple[Any, type]] = {
            "kv_cache_alloc_new_blocks": (kv.num_new_allocated_blocks, np.int32),
            "kv_cache_alloc_total_blocks": (kv.num_total_allocated_blocks, np.int32),
            "arrival_time_ns": (nanoseconds(timing.arrival_time), np.int64),
            "first_scheduled_time_ns": (nanoseconds(timing.first_scheduled_time), np.int64),
            "first_token_time_ns": (nanoseconds(timing.first_token_time), np.int64),
            "last_token_time_ns": (nanoseconds(timing.last_token_time), np.int64),
            "acceptance_rate": (spec.acceptance_rate, np.float32),
            "total_accepted_draft_tokens": (spec.total_accepted_draft_tokens, np.int32),
            "total_draft_tokens": (spec.total_draft_tokens, np.int32),
        }
        if nvidia_names:
            values["kv_cache_reused_block"] = (kv.num_reused_blocks, np.int32)
            values["kv_cache_missed_block"] = (kv.num_missed_blocks, np.int32)
            values["kv_cache_hit_rate"] = (kv.kv_cache_hit_rate, np.float32)
        else:
            values["kv_cache_reused_blocks"] = (kv.num_reused_blocks, np.int32)
        return {name: np.array([[value]], dtype) for name, (value, dtype) in values.items()}


def _numpy(tensor: Any) -> np.ndarray:
    """A torch tensor (or array) as fp32 numpy."""
    if hasattr(tensor, "detach"):
        tensor = tensor.detach().float().cpu().numpy()
    return np.asarray(tensor, np.float32)
