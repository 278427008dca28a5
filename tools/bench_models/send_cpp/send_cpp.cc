// Bench-only Triton backend: streams `n` responses of one or two small output tensors, like the Python
// stub_send model, from inside tritonserver (see config.pbtxt). Built by tools/bench_streaming.py with
// `g++ -shared`; the symbols below resolve against the tritonserver that loads the library.
//
// Compiled against the same Triton headers as the relay (engine_build.repository.relay_include_dir).
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <thread>

#include "triton/core/tritonbackend.h"

namespace {

// Responses sent back to back before a 1 ms pause. Triton's HTTP frontend hands each response to the connection's
// thread through a socketpair and drops it when that is full (the README's soak finding): unpaced, this loop
// outruns it at ~150,000 responses a second and the client never sees the end of its stream. A GPU engine's
// pace (one response per stream per step) never comes near; the pauses cost no CPU.
constexpr int32_t kBurst = 64;

// A failed call is reported and its error returned, so that the caller stops that request.
TRITONSERVER_Error* Check(TRITONSERVER_Error* error, const char* what) {
  if (error != nullptr) std::fprintf(stderr, "send_cpp: %s: %s\n", what, TRITONSERVER_ErrorMessage(error));
  return error;
}

// For calls whose failure ends nothing more than itself: report it and release the error.
void Report(TRITONSERVER_Error* error, const char* what) {
  if (Check(error, what) != nullptr) TRITONSERVER_ErrorDelete(error);
}

bool ReadInt32(TRITONBACKEND_Request* request, const char* name, int32_t* value) {
  TRITONBACKEND_Input* input = nullptr;
  const void* buffer = nullptr;
  uint64_t size = 0;
  TRITONSERVER_MemoryType memory_type = TRITONSERVER_MEMORY_CPU;
  int64_t memory_type_id = 0;
  TRITONSERVER_Error* error = Check(TRITONBACKEND_RequestInput(request, name, &input), name);
  if (error == nullptr) {
    error = Check(TRITONBACKEND_InputBuffer(input, 0, &buffer, &size, &memory_type, &memory_type_id), name);
  }
  if (error != nullptr) {
    TRITONSERVER_ErrorDelete(error);
    return false;
  }
  if (size < sizeof(int32_t) || memory_type != TRITONSERVER_MEMORY_CPU) return false;
  std::memcpy(value, buffer, sizeof(int32_t));
  return true;
}

// One response like a BLS token response: text_output ["tok"], and num_output_tokens [[index + 1]] if asked.
TRITONSERVER_Error* SendOne(TRITONBACKEND_ResponseFactory* factory, int32_t tensors, int32_t index) {
  static const char kText[] = "tok";
  TRITONBACKEND_Response* response = nullptr;
  TRITONSERVER_Error* error = Check(TRITONBACKEND_ResponseNewFromFactory(&response, factory), "new response");
  if (error != nullptr) return error;
  TRITONBACKEND_Output* output = nullptr;
  void* buffer = nullptr;
  TRITONSERVER_MemoryType memory_type = TRITONSERVER_MEMORY_CPU;
  int64_t memory_type_id = 0;
  const int64_t text_shape[1] = {1};
  const uint32_t text_length = sizeof(kText) - 1;  // BYTES elements: a 4-byte length, then the bytes
  error = Check(TRITONBACKEND_ResponseOutput(response, &output, "text_output", TRITONSERVER_TYPE_BYTES, text_shape, 1),
                "text_output");
  if (error == nullptr) {
    error = Check(TRITONBACKEND_OutputBuffer(output, &buffer, 4 + text_length, &memory_type, &memory_type_id),
                  "text_output buffer");
  }
  if (error == nullptr) {
    std::memcpy(buffer, &text_length, 4);
    std::memcpy(static_cast<char*>(buffer) + 4, kText, text_length);
  }
  if (error == nullptr && tensors == 2) {
    const int64_t count_shape[2] = {1, 1};
    const int32_t count = index + 1;
    error = Check(TRITONBACKEND_ResponseOutput(response, &output, "num_output_tokens", TRITONSERVER_TYPE_INT32,
                                               count_shape, 2), "num_output_tokens");
    if (error == nullptr) {
      error = Check(TRITONBACKEND_OutputBuffer(output, &buffer, sizeof(count), &memory_type, &memory_type_id),
                    "num_output_tokens buffer");
    }
    if (error == nullptr) std::memcpy(buffer, &count, sizeof(count));
  }
  // Sent with the error if building it failed (the error stays ours): the response is released either way.
  TRITONSERVER_Error* sent = Check(TRITONBACKEND_ResponseSend(response, 0, error), "send");
  if (error == nullptr) return sent;
  if (sent != nullptr) TRITONSERVER_ErrorDelete(sent);
  return error;
}

}  // namespace

extern "C" TRITONSERVER_Error* TRITONBACKEND_ModelInstanceExecute(TRITONBACKEND_ModelInstance* /*instance*/,
                                                                  TRITONBACKEND_Request** requests,
                                                                  const uint32_t request_count) {
  for (uint32_t r = 0; r < request_count; ++r) {  // one request at a time, like stub_send
    TRITONBACKEND_Request* request = requests[r];
    int32_t count = 0;
    int32_t tensors = 1;
    const bool read = ReadInt32(request, "n", &count) && ReadInt32(request, "tensors", &tensors);
    TRITONBACKEND_ResponseFactory* factory = nullptr;
    TRITONSERVER_Error* error = Check(TRITONBACKEND_ResponseFactoryNew(&factory, request), "response factory");
    Report(TRITONBACKEND_RequestRelease(request, TRITONSERVER_REQUEST_RELEASE_ALL), "release");
    if (error != nullptr) {
      TRITONSERVER_ErrorDelete(error);
      continue;
    }
    for (int32_t index = 0; read && index < count && error == nullptr; ++index) {
      if (index > 0 && index % kBurst == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      error = SendOne(factory, tensors, index);
    }
    if (error != nullptr) TRITONSERVER_ErrorDelete(error);
    if (!read) std::fprintf(stderr, "send_cpp: inputs n and tensors (INT32, in CPU memory) are required\n");
    Report(TRITONBACKEND_ResponseFactorySendFlags(factory, TRITONSERVER_RESPONSE_COMPLETE_FINAL), "final flag");
    Report(TRITONBACKEND_ResponseFactoryDelete(factory), "factory");
  }
  return nullptr;
}
