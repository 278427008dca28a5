"""Turning the logits of one forward pass into new tokens, with external draft tokens verified on the way.

TensorRT-LLM's `draft_tokens_external` semantics: the target model runs ONE forward over
[last token] + draft (or prompt + draft in the first step). Row i of the resulting logits is the target's
distribution after draft token i-1; the target chooses its own token there (with the request's sampling).
Draft tokens are accepted while they equal the target's choice; the first disagreement, or the row after the
last draft token, contributes one token of the target's own. So a step yields between 1 and len(draft)+1
tokens, exactly the tokens the target alone would have produced (for greedy requests).

end_id, stop words and the token limit are checked after every token, so an accepted run is cut where the
sequence ends. A plain decode step is the same thing with no draft tokens.

Guided decoding: the sampler masks every row with the grammar state after the tokens accepted so far, so a draft
token the grammar does not allow is never the target's choice and is rejected like any mismatch; the grammar only
ever sees accepted tokens (no rollback), and greedy guided output equals the target's alone. A guide's stop token
ends the sequence as end_id does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from bls.finish_reason import FinishReason
from embedded_engine.sampling import TokenSampler
from embedded_engine.stopping import StopCriteria


@dataclass
class StepTokens:
    token_ids: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    rows: list[int] = field(default_factory=list)  # logits row each token was chosen from
    accepted_drafts: int = 0
    finish_reason: FinishReason | None = None


def accept_tokens(
    logits: torch.Tensor,
    draft: Sequence[int],
    sampler: TokenSampler,
    tokens: list[int],
    prompt_len: int,
    stop: StopCriteria,
) -> StepTokens:
    """Choose tokens from `logits` ([len(draft)+1, vocab]) and append them to `tokens` (prompt + generated,
    extended in place). Returns what was appended and why the sequence ended, if it did."""
    step = StepTokens()
    for row in range(len(draft) + 1):
        chosen = sampler.choose(logits[row], tokens)
        if stop.is_end(chosen.token_id) or sampler.grammar_ended:
            step.finish_reason = FinishReason.END_ID
            break
        tokens.append(chosen.token_id)
        step.token_ids.append(chosen.token_id)
        step.rows.append(row)
        if chosen.log_prob is not None:
            step.log_probs.append(chosen.log_prob)
        draft_accepted = row < len(draft) and chosen.token_id == draft[row]
        step.accepted_drafts += draft_accepted
        step.finish_reason = stop.reason_after_append(tokens, prompt_len)
        if step.finish_reason is not None or not draft_accepted:
            break
    return step
