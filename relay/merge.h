// Engine responses of one stream merged into one: what the handoff (handoff.h) sends when several of a stream's
// responses wait together for its sender, so that Triton schedules the ensemble's later steps once for them.
//
// The merged response is what TensorRT-LLM 1.2.1's C++ backend sends for a step that produced all their tokens
// at once (as a streamed response of speculative decoding carries several): its streamed response is built in
// triton_backend/inflight_batcher_llm/src/model_instance_state.cc (fillTritonResponse; read at 0c8de69) from the
// executor's Result, which cpp/tensorrt_llm/batch_manager/llmRequest.cpp (LlmRequest::createResult; read at 119c6e6,
// the one stored copy) fills. Per output:
// - output_ids [1, beam, n]: a streamed response's tokens are those since the last response (createResult:
//   maxNbTokens - getMaxSentTokenLen), so the merged ids are the responses' ids in order;
// - sequence_length [1, beam]: each beam's length in that response (fillTritonResponse: beamLength[i] =
//   outputIds[i].size()), so their sum;
// - num_output_tokens [1, 1]: the tokens of that response, all beams (fillTritonResponse: outputTokensSize), so
//   their sum;
// - num_input_tokens [1, 1]: the prompt's length (requestData.inputTokensSize), the same in every response;
// - the perf metrics (kv_cache_alloc_new_blocks, kv_cache_reused_blocks, kv_cache_alloc_total_blocks,
//   arrival_time_ns, first_scheduled_time_ns, first_token_time_ns, last_token_time_ns, acceptance_rate,
//   total_accepted_draft_tokens, total_draft_tokens), [1, 1] each: the request's mPerfMetrics as they stand when
//   the response is made (createResult: result.requestPerfMetrics = mPerfMetrics), so the last response's.
// Any other output keeps its response apart, sent as the engine sent it: cum_log_probs and output_log_probs
// (cpp/tensorrt_llm/batch_manager/llmRequest.cpp createResult streams the whole sequence's log probs so far,
// result.logProbs = getLogProbs(), which the LLM API's tensorrt_llm/executor/result.py takes whole, asserting their
// length is the output's; the embedded engine and the LLM API model stream them so too: merged, the later response's
// would hold them all, yet such responses are kept apart, as the engine sent them),
// context_logits and generation_logits, batch_index and sequence_index (several sequences share the stream),
// context_phase_params, and any name not listed here. So does a response with more than one beam, data outside CPU
// memory, or output_ids that sequence_length does not describe exactly ([1, 1, n] with sequence_length [[n]]).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "relay.h"

namespace llama3_relay {

// An engine response's outputs, as read once on the sender's thread.
using EngineOutputs = std::vector<ResponseOutput>;

// Whether the response may be merged with others of its stream (the rules above).
bool Mergeable(const EngineOutputs& outputs);

// Whether `later`, Mergeable, may join a merge whose first response is `first`, Mergeable: both carry the same
// outputs (a count summed or a value taken from the last response must be in every one).
bool MergesWith(const EngineOutputs& first, const EngineOutputs& later);

// The first beam's ids of a response: output_ids [1, beam, len] up to sequence_length [1, beam], as postprocessing
// decodes them (empty where there are none or they cannot be read).
std::vector<int32_t> FirstBeamIds(const EngineOutputs& outputs);

// Tokens in the response's output_ids (its last dimension; one beam's), 0 if it has none.
int64_t OutputTokens(const EngineOutputs& outputs);

// One output of a merged response. `data` points into the MergedResponse (ids, sums) or into the last response.
struct MergedOutput {
  const char* name = nullptr;
  TRITONSERVER_DataType datatype = TRITONSERVER_TYPE_INVALID;
  std::vector<int64_t> shape;
  const void* data = nullptr;
  size_t byte_size = 0;
};

struct MergedResponse {
  std::vector<MergedOutput> outputs;  // in the last response's order
  std::vector<int32_t> ids;  // output_ids: every response's, in order
  int32_t sequence_length = 0;
  int32_t output_tokens = 0;  // num_output_tokens, where the responses carry it
};

// `responses` (at least one; each Mergeable, every one MergesWith the first) as one response, into `merged`, which
// must stay where it is while its outputs are used (they point into it).
void Merge(const std::vector<const EngineOutputs*>& responses, MergedResponse* merged);

}  // namespace llama3_relay
