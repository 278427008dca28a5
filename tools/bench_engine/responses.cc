// Output tensors and sending, shaped as TensorRT-LLM's backend shapes them for beam width 1 (as
// embedded_engine/responses.py does): output_ids [1, 1, count] INT32 and sequence_length [1, 1] INT32 (the tokens in
// this response), only those the request asked for.
#include <cstring>

#include "engine.h"

namespace bench_engine {
namespace {

std::string AddInt32Output(TRITONBACKEND_Response* response, const char* name, const int64_t* shape, uint32_t dims,
                           const int32_t* values, uint32_t count) {
  TRITONBACKEND_Output* output = nullptr;
  std::string failure = Failure(TRITONBACKEND_ResponseOutput(response, &output, name, TRITONSERVER_TYPE_INT32, shape,
                                                             dims));
  if (!failure.empty()) return failure;
  void* buffer = nullptr;
  TRITONSERVER_MemoryType memory_type = TRITONSERVER_MEMORY_CPU;
  int64_t memory_type_id = 0;
  failure = Failure(TRITONBACKEND_OutputBuffer(output, &buffer, count * sizeof(int32_t), &memory_type,
                                               &memory_type_id));
  // Every output gets its buffer, an empty one too (an output without one fails the response: "response output
  // count mismatch").
  if (failure.empty() && count > 0) std::memcpy(buffer, values, count * sizeof(int32_t));
  return failure;
}

}  // namespace

std::string SendTokens(const Stream& stream, const int32_t* tokens, uint32_t count, uint32_t flags) {
  TRITONBACKEND_Response* response = nullptr;
  std::string failure = Failure(TRITONBACKEND_ResponseNewFromFactory(&response, stream.factory));
  if (!failure.empty()) return failure;
  if (stream.send_output_ids) {
    const int64_t shape[3] = {1, 1, count};
    failure = AddInt32Output(response, "output_ids", shape, 3, tokens, count);
  }
  if (failure.empty() && stream.send_sequence_length) {
    const int64_t shape[2] = {1, 1};
    const int32_t length = static_cast<int32_t>(count);
    failure = AddInt32Output(response, "sequence_length", shape, 2, &length, 1);
  }
  // Sent with the error where building it failed: the response is released either way.
  TRITONSERVER_Error* error = failure.empty() ? nullptr : TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INTERNAL,
                                                                                failure.c_str());
  const std::string sent = Failure(TRITONBACKEND_ResponseSend(response, flags, error));
  if (error != nullptr) TRITONSERVER_ErrorDelete(error);
  return failure.empty() ? sent : failure;
}

void SendError(TRITONBACKEND_ResponseFactory* factory, TRITONSERVER_Error_Code code, const std::string& message) {
  TRITONBACKEND_Response* response = nullptr;
  TRITONSERVER_Error* error = TRITONSERVER_ErrorNew(code, message.c_str());
  std::string failure = Failure(TRITONBACKEND_ResponseNewFromFactory(&response, factory));
  if (failure.empty()) {
    failure = Failure(TRITONBACKEND_ResponseSend(response, TRITONSERVER_RESPONSE_COMPLETE_FINAL, error));
  }
  if (!failure.empty()) {
    Log(TRITONSERVER_LOG_ERROR, "cannot send the error \"" + message + "\": " + failure);
    LogFailure(TRITONBACKEND_ResponseFactorySendFlags(factory, TRITONSERVER_RESPONSE_COMPLETE_FINAL), "final flag");
  }
  TRITONSERVER_ErrorDelete(error);
}

}  // namespace bench_engine
