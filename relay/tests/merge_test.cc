// The handoff's merge of a stream's engine responses (relay/merge.h) against what the C++ backend sends for one
// step that produced the same tokens: every output byte for byte, the exact-text ids, and every response the
// rules keep apart refused. tests/unit/test_relay_cpp.py compiles it with sanitizers and runs it.
#include <cstdio>
#include <cstring>
#include <deque>
#include <string>
#include <vector>

#include "check.h"
#include "../merge.h"

using namespace llama3_relay;

namespace {

// Engine responses built here: the tensors' shapes and data live as long as the builder.
class Responses {
 public:
  template <typename T>
  ResponseOutput Tensor(const char* name, TRITONSERVER_DataType datatype, std::vector<int64_t> shape,
                        std::vector<T> values) {
    shapes_.push_back(std::move(shape));
    data_.emplace_back(reinterpret_cast<const char*>(values.data()),
                       reinterpret_cast<const char*>(values.data()) + values.size() * sizeof(T));
    ResponseOutput output;
    output.name = name;
    output.datatype = datatype;
    output.shape = shapes_.back().data();
    output.dims = shapes_.back().size();
    output.base = data_.back().data();
    output.byte_size = data_.back().size();
    return output;
  }
  ResponseOutput Int32(const char* name, int32_t value) {
    return Tensor<int32_t>(name, TRITONSERVER_TYPE_INT32, {1, 1}, {value});
  }

  // A streamed response as fillTritonResponse builds it for beam width 1: `ids` and their count, the prompt's
  // length, and the perf metrics as they stand at `step` (each a value of its own, so a mix-up shows).
  EngineOutputs Streamed(const std::vector<int32_t>& ids, int32_t step) {
    const int32_t n = static_cast<int32_t>(ids.size());
    return {
        Tensor<int32_t>("output_ids", TRITONSERVER_TYPE_INT32, {1, 1, n}, ids),
        Int32("sequence_length", n),
        Int32("num_input_tokens", 17),
        Int32("num_output_tokens", n),
        Int32("kv_cache_alloc_new_blocks", 100 + step),
        Int32("kv_cache_reused_blocks", 200 + step),
        Int32("kv_cache_alloc_total_blocks", 300 + step),
        Tensor<int64_t>("arrival_time_ns", TRITONSERVER_TYPE_INT64, {1, 1}, {int64_t{1000}}),
        Tensor<int64_t>("first_scheduled_time_ns", TRITONSERVER_TYPE_INT64, {1, 1}, {int64_t{2000}}),
        Tensor<int64_t>("first_token_time_ns", TRITONSERVER_TYPE_INT64, {1, 1}, {int64_t{3000}}),
        Tensor<int64_t>("last_token_time_ns", TRITONSERVER_TYPE_INT64, {1, 1}, {int64_t{4000} + step}),
        Tensor<float>("acceptance_rate", TRITONSERVER_TYPE_FP32, {1, 1}, {0.25f * static_cast<float>(step)}),
        Int32("total_accepted_draft_tokens", 400 + step),
        Int32("total_draft_tokens", 500 + step),
    };
  }
  // The same without the optional outputs: what a request that asks for none of them gets.
  EngineOutputs Bare(const std::vector<int32_t>& ids) {
    const int32_t n = static_cast<int32_t>(ids.size());
    return {Tensor<int32_t>("output_ids", TRITONSERVER_TYPE_INT32, {1, 1, n}, ids), Int32("sequence_length", n)};
  }

 private:
  std::deque<std::vector<int64_t>> shapes_;
  std::deque<std::vector<char>> data_;
};

std::vector<const EngineOutputs*> Pointers(const std::vector<EngineOutputs>& responses) {
  std::vector<const EngineOutputs*> pointers;
  for (const EngineOutputs& response : responses) pointers.push_back(&response);
  return pointers;
}

// The merged response equals `expected` (one response of the engine): same outputs, in order, byte for byte.
void CheckSameAs(const MergedResponse& merged, const EngineOutputs& expected) {
  CHECK(merged.outputs.size() == expected.size());
  for (size_t i = 0; i < merged.outputs.size() && i < expected.size(); ++i) {
    const MergedOutput& got = merged.outputs[i];
    const ResponseOutput& want = expected[i];
    CHECK(std::strcmp(got.name, want.name) == 0);
    CHECK(got.datatype == want.datatype);
    CHECK(got.shape == std::vector<int64_t>(want.shape, want.shape + want.dims));
    CHECK(got.byte_size == want.byte_size);
    const bool same_bytes = got.byte_size == want.byte_size && std::memcmp(got.data, want.base, got.byte_size) == 0;
    if (!same_bytes) std::fprintf(stderr, "output %s differs\n", want.name);
    CHECK(same_bytes);
  }
}

void MergedResponsesAreOneStepsResponse() {
  Responses r;
  // Three tokens in three responses, then the final response (no token: the end id ended the sequence).
  const std::vector<EngineOutputs> responses = {r.Streamed({11}, 1), r.Streamed({12}, 2), r.Streamed({13}, 3),
                                                r.Streamed({}, 4)};
  for (const EngineOutputs& response : responses) CHECK(Mergeable(response));
  for (const EngineOutputs& response : responses) CHECK(MergesWith(responses.front(), response));
  MergedResponse merged;
  Merge(Pointers(responses), &merged);
  // One step that produced the three tokens, its perf metrics as they stand at the last response.
  CheckSameAs(merged, r.Streamed({11, 12, 13}, 4));
  CHECK(merged.ids == (std::vector<int32_t>{11, 12, 13}));  // what the exact-text state is given
  // Read back as a response, the merged ids are what postprocessing decodes.
  EngineOutputs as_read;
  for (const MergedOutput& output : merged.outputs) {
    ResponseOutput read;
    read.name = output.name;
    read.datatype = output.datatype;
    read.shape = output.shape.data();
    read.dims = output.shape.size();
    read.base = output.data;
    read.byte_size = output.byte_size;
    as_read.push_back(read);
  }
  CHECK(FirstBeamIds(as_read) == merged.ids);
  CHECK(OutputTokens(as_read) == 3);
  CHECK(Mergeable(as_read));

  // Several tokens per response (speculative decoding's responses) merge the same way.
  const std::vector<EngineOutputs> drafted = {r.Streamed({1, 2, 3}, 1), r.Streamed({4, 5}, 2)};
  Merge(Pointers(drafted), &merged);
  CheckSameAs(merged, r.Streamed({1, 2, 3, 4, 5}, 2));

  // Without the optional outputs: ids and their length only.
  const std::vector<EngineOutputs> bare = {r.Bare({7}), r.Bare({8}), r.Bare({9})};
  Merge(Pointers(bare), &merged);
  CheckSameAs(merged, r.Bare({7, 8, 9}));

  // One response merged alone is itself.
  const std::vector<EngineOutputs> alone = {r.Streamed({21}, 1)};
  Merge(Pointers(alone), &merged);
  CheckSameAs(merged, r.Streamed({21}, 1));
}

void ResponsesWithOtherOutputsStayApart() {
  Responses r;
  CHECK(Mergeable(r.Streamed({1}, 1)));
  // Outputs whose streamed semantics differ between engines, or that are not per stream: never merged.
  for (const char* name : {"cum_log_probs", "batch_index", "sequence_index"}) {
    EngineOutputs outputs = r.Bare({1});
    outputs.push_back(r.Tensor<float>(name, TRITONSERVER_TYPE_FP32, {1, 1}, {0.5f}));
    CHECK(!Mergeable(outputs));
  }
  EngineOutputs log_probs = r.Bare({1, 2});
  log_probs.push_back(r.Tensor<float>("output_log_probs", TRITONSERVER_TYPE_FP32, {1, 1, 2}, {-0.5f, -0.25f}));
  CHECK(!Mergeable(log_probs));
  EngineOutputs generation_logits = r.Bare({1});
  generation_logits.push_back(r.Tensor<float>("generation_logits", TRITONSERVER_TYPE_FP32, {1, 1, 1, 2}, {0, 1}));
  CHECK(!Mergeable(generation_logits));
  EngineOutputs context_logits = r.Bare({1});
  context_logits.push_back(r.Tensor<float>("context_logits", TRITONSERVER_TYPE_FP32, {1, 2, 2}, {0, 1, 2, 3}));
  CHECK(!Mergeable(context_logits));
  EngineOutputs unknown = r.Bare({1});
  unknown.push_back(r.Int32("an_output_of_a_later_version", 1));
  CHECK(!Mergeable(unknown));
  // Two beams.
  CHECK(!Mergeable({r.Tensor<int32_t>("output_ids", TRITONSERVER_TYPE_INT32, {1, 2, 1}, {1, 2}),
                    r.Tensor<int32_t>("sequence_length", TRITONSERVER_TYPE_INT32, {1, 2}, {1, 1})}));
  // Ids that sequence_length does not describe exactly (padding), or without it.
  CHECK(!Mergeable({r.Tensor<int32_t>("output_ids", TRITONSERVER_TYPE_INT32, {1, 1, 2}, {1, -1}),
                    r.Int32("sequence_length", 1)}));
  CHECK(!Mergeable({r.Tensor<int32_t>("output_ids", TRITONSERVER_TYPE_INT32, {1, 1, 1}, {1})}));
  CHECK(!Mergeable({r.Int32("sequence_length", 0)}));
  // Ids of another type; a count that is not one INT32.
  CHECK(!Mergeable({r.Tensor<int64_t>("output_ids", TRITONSERVER_TYPE_INT64, {1, 1, 1}, {int64_t{1}}),
                    r.Int32("sequence_length", 1)}));
  EngineOutputs odd_count = r.Bare({1});
  odd_count.push_back(r.Tensor<int64_t>("num_output_tokens", TRITONSERVER_TYPE_INT64, {1, 1}, {int64_t{1}}));
  CHECK(!Mergeable(odd_count));
  // Data outside CPU memory.
  EngineOutputs on_gpu = r.Bare({1});
  on_gpu[0].memory_type = TRITONSERVER_MEMORY_GPU;
  CHECK(!Mergeable(on_gpu));
  // Responses that carry different outputs do not merge with each other.
  EngineOutputs counted = r.Bare({2});
  counted.push_back(r.Int32("num_output_tokens", 1));
  CHECK(Mergeable(counted));
  CHECK(!MergesWith(r.Bare({1}), counted));
  CHECK(!MergesWith(counted, r.Bare({1})));
  CHECK(MergesWith(counted, counted));
}

void IdsAndTokensOfOneResponse() {
  Responses r;
  CHECK(FirstBeamIds(r.Bare({4, 5, 6})) == (std::vector<int32_t>{4, 5, 6}));
  CHECK(FirstBeamIds(r.Bare({})).empty());
  CHECK(OutputTokens(r.Bare({4, 5, 6})) == 3);
  // Padded ids: up to sequence_length, as postprocessing decodes them.
  CHECK(FirstBeamIds({r.Tensor<int32_t>("output_ids", TRITONSERVER_TYPE_INT32, {1, 1, 3}, {4, 5, -1}),
                      r.Int32("sequence_length", 2)}) == (std::vector<int32_t>{4, 5}));
  CHECK(OutputTokens({r.Int32("sequence_length", 2)}) == 0);
}

}  // namespace

int main() {
  MergedResponsesAreOneStepsResponse();
  ResponsesWithOtherOutputsStayApart();
  IdsAndTokensOfOneResponse();
  return llama3_relay_tests::Finish("the handoff merge");
}
