// Engine responses of one stream merged into one (merge.h has the rules and their upstream sources).
#include "merge.h"

#include <algorithm>
#include <cstring>

namespace llama3_relay {

namespace {

constexpr char kOutputIds[] = "output_ids";
constexpr char kSequenceLength[] = "sequence_length";
constexpr char kNumOutputTokens[] = "num_output_tokens";
// Outputs whose merged value is the last response's (merge.h says why each).
constexpr const char* kLastValue[] = {
    "num_input_tokens",       "kv_cache_alloc_new_blocks", "kv_cache_reused_blocks", "kv_cache_alloc_total_blocks",
    "arrival_time_ns",        "first_scheduled_time_ns",   "first_token_time_ns",    "last_token_time_ns",
    "acceptance_rate",        "total_accepted_draft_tokens", "total_draft_tokens",
};

bool Named(const ResponseOutput& output, const char* name) { return std::strcmp(output.name, name) == 0; }

const ResponseOutput* Find(const EngineOutputs& outputs, const char* name) {
  for (const ResponseOutput& output : outputs) {
    if (Named(output, name)) return &output;
  }
  return nullptr;
}

// A [1, 1] INT32 output's value, if it is one.
bool ScalarInt32(const ResponseOutput& output, int32_t* value) {
  if (output.datatype != TRITONSERVER_TYPE_INT32 || output.dims != 2 || output.shape[0] != 1 ||
      output.shape[1] != 1 || output.byte_size != sizeof(int32_t)) {
    return false;
  }
  std::memcpy(value, output.base, sizeof(int32_t));
  return true;
}

bool IsLastValue(const ResponseOutput& output) {
  return std::any_of(std::begin(kLastValue), std::end(kLastValue),
                     [&](const char* name) { return Named(output, name); });
}

}  // namespace

bool Mergeable(const EngineOutputs& outputs) {
  const ResponseOutput* ids = Find(outputs, kOutputIds);
  const ResponseOutput* length = Find(outputs, kSequenceLength);
  int32_t value = 0;
  if (ids == nullptr || length == nullptr || ids->datatype != TRITONSERVER_TYPE_INT32 || ids->dims != 3 ||
      ids->shape[0] != 1 || ids->shape[1] != 1 ||
      ids->byte_size != static_cast<size_t>(ids->shape[2]) * sizeof(int32_t) || !ScalarInt32(*length, &value) ||
      value != ids->shape[2]) {
    return false;
  }
  for (const ResponseOutput& output : outputs) {
    if (output.memory_type == TRITONSERVER_MEMORY_GPU) return false;
    if (&output == ids || &output == length) continue;
    if (Named(output, kNumOutputTokens) ? !ScalarInt32(output, &value) : !IsLastValue(output)) return false;
  }
  return true;
}

bool MergesWith(const EngineOutputs& first, const EngineOutputs& later) {
  if (first.size() != later.size()) return false;
  return std::all_of(later.begin(), later.end(),
                     [&](const ResponseOutput& output) { return Find(first, output.name) != nullptr; });
}

std::vector<int32_t> FirstBeamIds(const EngineOutputs& outputs) {
  const ResponseOutput* ids = Find(outputs, kOutputIds);
  const ResponseOutput* length = Find(outputs, kSequenceLength);
  if (ids == nullptr || ids->dims != 3 || ids->datatype != TRITONSERVER_TYPE_INT32 ||
      ids->memory_type == TRITONSERVER_MEMORY_GPU) {
    return {};
  }
  int64_t n = ids->shape[2];
  if (length != nullptr && length->datatype == TRITONSERVER_TYPE_INT32 && length->byte_size >= sizeof(int32_t) &&
      length->memory_type != TRITONSERVER_MEMORY_GPU) {
    int32_t first = 0;
    std::memcpy(&first, length->base, sizeof(first));
    n = std::max<int64_t>(0, std::min<int64_t>(n, first));
  }
  if (ids->byte_size < static_cast<size_t>(n) * sizeof(int32_t)) return {};
  const int32_t* base = static_cast<const int32_t*>(ids->base);
  return std::vector<int32_t>(base, base + n);
}

int64_t OutputTokens(const EngineOutputs& outputs) {
  const ResponseOutput* ids = Find(outputs, kOutputIds);
  return ids == nullptr || ids->dims == 0 ? 0 : ids->shape[ids->dims - 1];
}

void Merge(const std::vector<const EngineOutputs*>& responses, MergedResponse* merged) {
  merged->ids.clear();
  merged->sequence_length = 0;
  merged->output_tokens = 0;
  for (const EngineOutputs* outputs : responses) {
    const ResponseOutput* ids = Find(*outputs, kOutputIds);
    const int32_t* base = static_cast<const int32_t*>(ids->base);
    merged->ids.insert(merged->ids.end(), base, base + ids->shape[2]);
    int32_t value = 0;
    ScalarInt32(*Find(*outputs, kSequenceLength), &value);
    merged->sequence_length += value;
    const ResponseOutput* count = Find(*outputs, kNumOutputTokens);
    if (count != nullptr && ScalarInt32(*count, &value)) merged->output_tokens += value;
  }
  merged->outputs.clear();
  for (const ResponseOutput& output : *responses.back()) {
    MergedOutput out;
    out.name = output.name;
    out.datatype = output.datatype;
    if (Named(output, kOutputIds)) {
      out.shape = {1, 1, static_cast<int64_t>(merged->ids.size())};
      out.data = merged->ids.data();
      out.byte_size = merged->ids.size() * sizeof(int32_t);
    } else if (Named(output, kSequenceLength) || Named(output, kNumOutputTokens)) {
      out.shape = {1, 1};
      out.data = Named(output, kSequenceLength) ? &merged->sequence_length : &merged->output_tokens;
      out.byte_size = sizeof(int32_t);
    } else {
      out.shape.assign(output.shape, output.shape + output.dims);
      out.data = output.base;
      out.byte_size = output.byte_size;
    }
    merged->outputs.push_back(std::move(out));
  }
}

}  // namespace llama3_relay
