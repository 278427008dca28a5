"""Why a generation ended: one vocabulary for the engine, the BLS's `finish_reason` output and metric labels."""

from __future__ import annotations

from enum import StrEnum


class FinishReason(StrEnum):
    END_ID = "end_id"  # the engine sampled end_id (not part of the output)
    STOP_WORDS = "stop_words"  # a stop word completed (part of the output)
    STOP = "stop"  # one of the two above, where the caller cannot tell which (an engine does not say)
    LENGTH = "length"  # request_output_len / max_tokens tokens were generated
    CANCELLED = "cancelled"  # the client went away or sent `stop`

    @property
    def reported(self) -> FinishReason:
        """What clients and metrics see: OpenAI's vocabulary (stop, length) plus cancelled."""
        return FinishReason.STOP if self in (FinishReason.END_ID, FinishReason.STOP_WORDS) else self


# The values the BLS reports (its `finish_reason` output) and the llm_requests_total label (bls.llm_metrics).
REPORTED_FINISH_REASONS = (FinishReason.STOP, FinishReason.LENGTH, FinishReason.CANCELLED)
