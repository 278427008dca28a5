// A request into a Stream (its inputs, as TensorRT-LLM's backend reads them), and the queue limit: beyond
// max_active_requests generating and max_queued_requests waiting, a request is refused at once with UNAVAILABLE
// "Exceeds maximum queue size", the code and words Triton core answers a full queue with
// (core src/dynamic_batch_scheduler.cc), which Triton's HTTP frontend turns into 503 (server src/http_server.cc
// HttpCodeFromError, r24.10 and r26.07) and its gRPC frontend into UNAVAILABLE.
#include <cstring>

#include "engine.h"

namespace bench_engine {
namespace {

// Whether the request has input `name`; its first `size` bytes into `value` (CPU memory). "" or what is wrong.
std::string ReadScalar(TRITONBACKEND_Request* request, const char* name, void* value, size_t size, bool* present) {
  TRITONBACKEND_Input* input = nullptr;
  *present = Failure(TRITONBACKEND_RequestInput(request, name, &input)).empty();
  if (!*present) return "";
  const void* buffer = nullptr;
  uint64_t byte_size = 0;
  TRITONSERVER_MemoryType memory_type = TRITONSERVER_MEMORY_CPU;
  int64_t memory_type_id = 0;
  std::string failure = Failure(TRITONBACKEND_InputBuffer(input, 0, &buffer, &byte_size, &memory_type,
                                                          &memory_type_id));
  if (!failure.empty()) return std::string(name) + ": " + failure;
  if (memory_type == TRITONSERVER_MEMORY_GPU || byte_size < size) {
    return std::string(name) + ": expected " + std::to_string(size) + " bytes in CPU memory";
  }
  std::memcpy(value, buffer, size);
  return "";
}

// The outputs TensorRT-LLM computes only when a flag asks: the bench engine computes none of them.
constexpr const char* kUnsupportedFlags[] = {"return_log_probs", "return_context_logits", "return_generation_logits",
                                             "return_perf_metrics", "return_kv_cache_reuse_stats"};
// Inputs asking for more than one sequence a request.
constexpr const char* kUnsupportedCounts[] = {"beam_width", "num_return_sequences"};

}  // namespace

std::string ReadRequest(TRITONBACKEND_Request* request, Stream* stream, TRITONSERVER_Error_Code* code) {
  *code = TRITONSERVER_ERROR_INVALID_ARG;
  TRITONBACKEND_Input* input = nullptr;
  std::string failure = Failure(TRITONBACKEND_RequestInput(request, "input_ids", &input));
  if (!failure.empty()) return "input_ids: required (" + failure + ")";
  const int64_t* shape = nullptr;
  uint32_t dims = 0;
  uint64_t byte_size = 0;
  failure = Failure(TRITONBACKEND_InputProperties(input, nullptr, nullptr, &shape, &dims, &byte_size, nullptr));
  if (!failure.empty()) return "input_ids: " + failure;
  if (dims != 2 || shape[0] != 1) {
    *code = TRITONSERVER_ERROR_UNSUPPORTED;
    return "input_ids: the bench engine serves one sequence a request (shape [1, length])";
  }
  stream->prompt_length = static_cast<int32_t>(shape[1]);
  bool present = false;
  failure = ReadScalar(request, "request_output_len", &stream->output_len, sizeof(int32_t), &present);
  if (!failure.empty()) return failure;
  if (!present) return "request_output_len: required";
  if (stream->output_len < 1) {
    return "request_output_len: must be at least 1, not " + std::to_string(stream->output_len);
  }
  failure = ReadScalar(request, "end_id", &stream->end_id, sizeof(int32_t), &present);
  if (!failure.empty()) return failure;
  if (!present) stream->end_id = -1;
  failure = ReadScalar(request, "streaming", &stream->streaming, sizeof(bool), &present);
  if (!failure.empty()) return failure;
  for (const char* flag : kUnsupportedFlags) {
    bool value = false;
    failure = ReadScalar(request, flag, &value, sizeof(bool), &present);
    if (!failure.empty()) return failure;
    if (value) {
      *code = TRITONSERVER_ERROR_UNSUPPORTED;
      return std::string(flag) + ": the bench engine computes no such output";
    }
  }
  for (const char* count : kUnsupportedCounts) {
    int32_t value = 1;
    failure = ReadScalar(request, count, &value, sizeof(int32_t), &present);
    if (!failure.empty()) return failure;
    if (value > 1) {
      *code = TRITONSERVER_ERROR_UNSUPPORTED;
      return std::string(count) + ": the bench engine generates one sequence a request, not " + std::to_string(value);
    }
  }
  uint32_t outputs = 0;
  failure = Failure(TRITONBACKEND_RequestOutputCount(request, &outputs));
  for (uint32_t index = 0; failure.empty() && index < outputs; ++index) {
    const char* name = nullptr;
    failure = Failure(TRITONBACKEND_RequestOutputName(request, index, &name));
    if (failure.empty() && std::strcmp(name, "output_ids") == 0) stream->send_output_ids = true;
    if (failure.empty() && std::strcmp(name, "sequence_length") == 0) stream->send_sequence_length = true;
  }
  if (!failure.empty()) *code = TRITONSERVER_ERROR_INTERNAL;
  return failure;
}

void Engine::Admit(TRITONBACKEND_ModelInstance* instance, TRITONBACKEND_Request** requests, uint32_t count) {
  for (uint32_t r = 0; r < count; ++r) {
    TRITONBACKEND_Request* request = requests[r];
    const uint64_t arrived_ns = NowNs();
    auto stream = std::make_unique<Stream>();
    std::string failure = Failure(TRITONBACKEND_ResponseFactoryNew(&stream->factory, request));
    if (!failure.empty()) {  // no way to answer: Triton fails a request released without a response
      Log(TRITONSERVER_LOG_ERROR, "cannot answer a request: " + failure);
      LogFailure(TRITONBACKEND_RequestRelease(request, TRITONSERVER_REQUEST_RELEASE_ALL), "release");
      continue;
    }
    TRITONSERVER_Error_Code code = TRITONSERVER_ERROR_INVALID_ARG;
    failure = ReadRequest(request, stream.get(), &code);
    if (failure.empty()) {
      std::lock_guard<std::mutex> lock(mutex_);
      if (stopping_) {
        code = TRITONSERVER_ERROR_UNAVAILABLE;
        failure = settings_.model_name + ": unloading";
      } else if (held_ >= static_cast<size_t>(settings_.max_active) + settings_.max_queued) {
        code = TRITONSERVER_ERROR_UNAVAILABLE;
        failure = "Exceeds maximum queue size: " + std::to_string(held_) + " sequences held (max_active_requests " +
                  std::to_string(settings_.max_active) + " + max_queued_requests " +
                  std::to_string(settings_.max_queued) + ")";
      } else {
        ++held_;
        waiting_.push_back(std::move(stream));
      }
    }
    if (!failure.empty()) {
      SendError(stream->factory, code, settings_.model_name + ": " + failure);
      LogFailure(TRITONBACKEND_ResponseFactoryDelete(stream->factory), "response factory");
    } else {
      wake_.notify_one();
    }
    const uint64_t now = NowNs();
    LogFailure(TRITONBACKEND_ModelInstanceReportStatistics(instance, request, failure.empty(), arrived_ns, arrived_ns,
                                                           now, now), "statistics");
    LogFailure(TRITONBACKEND_RequestRelease(request, TRITONSERVER_REQUEST_RELEASE_ALL), "release");
  }
}

}  // namespace bench_engine
