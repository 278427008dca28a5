// Engine calls: a Python process's request to one of the configured engines (`engine_models`: the target and its
// draft) is sent in-process (TRITONSERVER_ServerInferAsync, outputs on the heap) and every engine response is
// written back to that process's connection as a frame from Triton's callback thread, as it comes: no frontend,
// JSON or socket per stream in the per-token path.
#include <cstdlib>
#include <cstring>

#include "relay.h"

namespace llama3_relay {
namespace {

TRITONSERVER_Error* AllocateOnHeap(TRITONSERVER_ResponseAllocator*, const char* tensor_name, size_t byte_size,
                                   TRITONSERVER_MemoryType, int64_t, void*, void** buffer, void** buffer_userp,
                                   TRITONSERVER_MemoryType* actual_memory_type, int64_t* actual_memory_type_id) {
  *buffer = byte_size == 0 ? nullptr : std::malloc(byte_size);
  *buffer_userp = nullptr;
  *actual_memory_type = TRITONSERVER_MEMORY_CPU;
  *actual_memory_type_id = 0;
  if (byte_size != 0 && *buffer == nullptr) {
    return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INTERNAL,
                                 (std::string("llama3_relay: no memory for engine output ") + tensor_name).c_str());
  }
  return nullptr;
}

TRITONSERVER_Error* FreeHeap(TRITONSERVER_ResponseAllocator*, void* buffer, void*, size_t, TRITONSERVER_MemoryType,
                             int64_t) {
  std::free(buffer);
  return nullptr;
}

// An engine response's outputs as a frame of `kind`; "" when they could be read, else why not.
std::string ResponseFrame(uint64_t id, FrameKind kind, TRITONSERVER_InferenceResponse* response,
                          std::vector<char>* out) {
  TensorFrameWriter writer(id, kind);
  uint32_t count = 0;
  std::string failure = response == nullptr ? "" : Failure(TRITONSERVER_InferenceResponseOutputCount(response, &count));
  if (failure.empty() && count > UINT16_MAX) failure = "more than 65535 outputs";
  for (uint32_t i = 0; failure.empty() && i < count; ++i) {
    ResponseOutput output;
    failure = ReadOutput(response, i, &output);
    if (!failure.empty()) break;
    if (output.dims > kMaxDims) failure = std::string("output ") + output.name + " has more than 16 dims";
    if (std::strlen(output.name) > UINT16_MAX) failure = "an output name longer than 65535 bytes";
    if (output.memory_type != TRITONSERVER_MEMORY_CPU && output.memory_type != TRITONSERVER_MEMORY_CPU_PINNED) {
      failure = std::string("output ") + output.name + " is not in CPU memory";
    }
    if (failure.empty()) {
      writer.Add(output.name, output.datatype, output.shape, output.dims, output.base, output.byte_size);
    }
  }
  if (failure.empty()) *out = writer.Finish();
  if (failure.empty() && out->size() - sizeof(uint32_t) > kMaxFrameBytes) failure = "a response larger than a frame";
  return failure;
}

}  // namespace

TRITONSERVER_Error* NewEngineAllocator(TRITONSERVER_ResponseAllocator** allocator) {
  return TRITONSERVER_ResponseAllocatorNew(allocator, AllocateOnHeap, FreeHeap, nullptr);
}

// An engine request frame becomes an in-process request to the engine; its responses go back to `connection`. ""
// unless the connection is hostile (a model not configured, a call number still in use). Triton's refusals go
// back as the call's error frame.
std::string Relay::StartEngineCall(const Frame& frame, std::vector<char>& body, Connection* connection) {
  if (engine_models_.count(frame.model) == 0) {
    return "an engine call to " + (frame.model.empty() ? std::string("no model") : "'" + frame.model + "'") +
           ", which is not one of the configured engine_models";
  }
  auto owned = std::make_unique<EngineCall>();
  EngineCall* call = owned.get();
  call->relay = this;
  call->id = frame.stream;
  call->connection = connection->serial;
  call->body.swap(body);  // the inputs' data stays where it is, owned by the call
  const char* data = call->body.data();
  std::lock_guard<std::recursive_mutex> lock(mutex_);  // held through InferAsync: callbacks wait for the call's entry
  for (const auto& entry : calls_) {
    if (entry.second->connection == connection->serial && entry.second->id == frame.stream) {
      return "engine call " + std::to_string(frame.stream) + " again while it runs";
    }
  }
  TRITONSERVER_Error* error = TRITONSERVER_InferenceRequestNew(&call->request, server_, frame.model.c_str(), -1);
  if (error == nullptr && !frame.request_id.empty()) {
    error = TRITONSERVER_InferenceRequestSetId(call->request, frame.request_id.c_str());
  }
  for (const FrameTensor& tensor : frame.tensors) {
    if (error == nullptr) {
      error = TRITONSERVER_InferenceRequestAddInput(call->request, tensor.name.c_str(), tensor.datatype,
                                                    tensor.shape.data(), tensor.shape.size());
    }
    if (error == nullptr) {
      error = TRITONSERVER_InferenceRequestAppendInputData(call->request, tensor.name.c_str(), data + tensor.data,
                                                           tensor.length, TRITONSERVER_MEMORY_CPU, 0);
    }
  }
  for (const std::string& name : frame.requested) {
    if (error == nullptr) error = TRITONSERVER_InferenceRequestAddRequestedOutput(call->request, name.c_str());
  }
  if (error == nullptr) error = TRITONSERVER_InferenceRequestSetReleaseCallback(call->request, OnEngineReleased, call);
  if (error == nullptr) {
    error = TRITONSERVER_InferenceRequestSetResponseCallback(call->request, engine_allocator_, nullptr,
                                                             OnEngineResponse, call);
  }
  call->serial = next_call_++;
  if (error == nullptr) {
    calls_.emplace(call->serial, std::move(owned));
    error = TRITONSERVER_ServerInferAsync(server_, call->request, nullptr);
    if (error == nullptr) return "";
    owned = std::move(calls_[call->serial]);  // Triton did not take it: ours to delete
    calls_.erase(call->serial);
  }
  Queue(connection->serial, ErrorFrame(frame.stream, kEngineError, TRITONSERVER_ErrorCode(error),
                                       frame.model + ": " + TRITONSERVER_ErrorMessage(error)));
  TRITONSERVER_ErrorDelete(error);
  if (call->request != nullptr) LogFailure(TRITONSERVER_InferenceRequestDelete(call->request), "engine request");
  return "";
}

// The Python process has stopped reading the call: Triton cancels it. A call already ended is not found (its
// final frame and the cancel crossed): nothing to do.
void Relay::CancelEngineCall(uint64_t id, uint64_t connection) {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  for (auto& entry : calls_) {
    EngineCall* call = entry.second.get();
    if (call->connection != connection || call->id != id) continue;
    call->connection = 0;
    if (!call->complete) LogFailure(TRITONSERVER_InferenceRequestCancel(call->request), "cancelling an engine call");
    return;
  }
}

void Relay::OnEngineResponse(TRITONSERVER_InferenceResponse* response, const uint32_t flags, void* userp) {
  EngineCall* call = static_cast<EngineCall*>(userp);
  Relay* relay = call->relay;
  const bool final = (flags & TRITONSERVER_RESPONSE_COMPLETE_FINAL) != 0;
  std::vector<char> frame;  // built outside the lock
  bool ends = final;
  TRITONSERVER_Error* error = response == nullptr ? nullptr : TRITONSERVER_InferenceResponseError(response);
  if (error != nullptr) {  // owned by the response
    frame = ErrorFrame(call->id, kEngineError, TRITONSERVER_ErrorCode(error), TRITONSERVER_ErrorMessage(error));
    ends = true;
  } else if (response != nullptr || final) {
    const std::string failure = ResponseFrame(call->id, final ? kEngineFinal : kEngineResponse, response, &frame);
    if (!failure.empty()) {
      frame = ErrorFrame(call->id, kEngineError, TRITONSERVER_ERROR_INTERNAL, "llama3_relay: " + failure);
      ends = true;
    }
  }
  if (response != nullptr) LogFailure(TRITONSERVER_InferenceResponseDelete(response), "engine response");
  std::lock_guard<std::recursive_mutex> lock(relay->mutex_);
  if (!call->ended && !frame.empty()) {
    relay->Queue(call->connection, frame);
    call->ended = ends;
  }
  if (final) {
    call->complete = true;
    relay->ForgetIfDone(call);
  }
}

void Relay::OnEngineReleased(TRITONSERVER_InferenceRequest*, const uint32_t, void* userp) {
  EngineCall* call = static_cast<EngineCall*>(userp);
  std::lock_guard<std::recursive_mutex> lock(call->relay->mutex_);
  call->released = true;
  call->relay->ForgetIfDone(call);
}

void Relay::ForgetIfDone(EngineCall* call) {
  if (!call->released || !call->complete) return;
  LogFailure(TRITONSERVER_InferenceRequestDelete(call->request), "engine request");
  calls_.erase(call->serial);
}

// The connection is gone (0: the calls already cancelled by Python): its engine calls are cancelled, nobody reads
// them. With or without the lock.
void Relay::StopEngineCalls(uint64_t connection) {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  for (auto& entry : calls_) {
    EngineCall* call = entry.second.get();
    if (call->connection != connection) continue;
    call->connection = 0;
    if (!call->complete) LogFailure(TRITONSERVER_InferenceRequestCancel(call->request), "cancelling an engine call");
  }
}

void Relay::CancelEngineCalls() {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  for (auto& entry : calls_) {
    EngineCall* call = entry.second.get();
    call->connection = 0;
    if (!call->complete) LogFailure(TRITONSERVER_InferenceRequestCancel(call->request), "cancelling an engine call");
  }
}

bool Relay::StopAll() {
  CancelEngineCalls();
  const auto deadline = std::chrono::steady_clock::now() + kUnloadWait;
  while (std::chrono::steady_clock::now() < deadline) {
    {
      std::lock_guard<std::recursive_mutex> lock(mutex_);
      if (calls_.empty()) return true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

}  // namespace llama3_relay
