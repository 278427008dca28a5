// Client requests: each is forwarded to the Python model as a child request, and the frames its process writes for
// it become the client's responses (relay.h says how a request goes).
#include <unistd.h>

#include <cstring>

#include "relay.h"
#include "token.h"

namespace llama3_relay {
namespace {

std::string Hex(const std::string& bytes) {
  static const char kDigits[] = "0123456789abcdef";
  std::string hex;
  for (unsigned char byte : bytes) {
    hex += kDigits[byte >> 4];
    hex += kDigits[byte & 15];
  }
  return hex;
}

// Compares every byte whatever the first difference: the time taken says nothing about the token.
bool SameToken(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char difference = 0;
  for (size_t i = 0; i < a.size(); ++i) difference |= static_cast<unsigned char>(a[i] ^ b[i]);
  return difference == 0;
}

// The child's responses carry no outputs (the Python model sends them as frames): an allocation is a bug.
TRITONSERVER_Error* RefuseAllocation(TRITONSERVER_ResponseAllocator*, const char* tensor_name, size_t,
                                     TRITONSERVER_MemoryType, int64_t, void*, void** buffer, void** buffer_userp,
                                     TRITONSERVER_MemoryType* actual_memory_type, int64_t* actual_memory_type_id) {
  *buffer = nullptr;
  *buffer_userp = nullptr;
  *actual_memory_type = TRITONSERVER_MEMORY_CPU;
  *actual_memory_type_id = 0;
  return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INTERNAL,
                               (std::string("llama3_relay: the Python model sent output ") + tensor_name +
                                " through Triton; relayed requests send every output as a frame")
                                   .c_str());
}

TRITONSERVER_Error* ReleaseNothing(TRITONSERVER_ResponseAllocator*, void*, void*, size_t, TRITONSERVER_MemoryType,
                                   int64_t) {
  return nullptr;
}

}  // namespace

TRITONSERVER_Error* NewChildAllocator(TRITONSERVER_ResponseAllocator** allocator) {
  return TRITONSERVER_ResponseAllocatorNew(allocator, RefuseAllocation, ReleaseNothing, nullptr);
}

void Relay::Execute(TRITONBACKEND_ModelInstance* instance, TRITONBACKEND_Request** requests, uint32_t count) {
  const uint64_t start = NowNs();
  for (uint32_t i = 0; i < count; ++i) Forward(instance, requests[i]);
  const uint64_t end = NowNs();
  LogFailure(TRITONBACKEND_ModelInstanceReportBatchStatistics(instance, count, start, start, end, end), "statistics");
}

void Relay::Forward(TRITONBACKEND_ModelInstance* instance, TRITONBACKEND_Request* request) {
  auto owned = std::make_unique<Stream>();
  Stream* stream = owned.get();
  stream->relay = this;
  stream->instance = instance;
  stream->arrived_ns = NowNs();
  stream->request = request;
  const std::string factory_failure = Failure(TRITONBACKEND_ResponseFactoryNew(&stream->factory, request));
  if (!factory_failure.empty()) {  // no way to answer: Triton fails a request released without a response
    Log(TRITONSERVER_LOG_ERROR, "cannot answer a request: " + factory_failure);
    LogFailure(TRITONBACKEND_RequestRelease(request, TRITONSERVER_REQUEST_RELEASE_ALL), "release");
    return;
  }
  {
    std::lock_guard<std::recursive_mutex> lock(mutex_);  // the reader may look the stream up (a claim) from now on
    stream->id = next_stream_++;
    stream->token = StreamToken(key_, stream->id);
    streams_.emplace(stream->id, std::move(owned));
  }
  // Requests still come while Triton's frontends drain (docs/operations.md, "Stopping the server"): refused.
  const std::string failure = exiting_ ? kShutdownMessage : Start(stream);
  if (failure.empty()) return;
  std::vector<Finished> to_release;
  {
    std::lock_guard<std::recursive_mutex> lock(mutex_);
    stream->child_started = false;
    if (stream->child != nullptr) {  // Triton did not take it: ours to delete
      LogFailure(TRITONSERVER_InferenceRequestDelete(stream->child), "child request");
      stream->child = nullptr;
    }
    const bool invalid = failure.rfind("INVALID:", 0) == 0;
    if (stream->factory != nullptr) {  // else a shutdown ended it meanwhile (EndForShutdown)
      SendError(stream, invalid ? TRITONSERVER_ERROR_INVALID_ARG : TRITONSERVER_ERROR_UNAVAILABLE,
                invalid ? failure.substr(8) : model_name_ + ": " + failure);
    }
    stream->child_complete = true;
    ReleaseIfDone(stream, &to_release);
  }
  ReleaseAll(to_release);
}

// Builds the child request and hands it to Triton; the reason when it could not ("INVALID:" + the message
// for the client's own mistakes).
std::string Relay::Start(Stream* stream) {
  TRITONBACKEND_Request* request = stream->request;
  uint32_t count = 0;
  std::string failure = Failure(TRITONBACKEND_RequestOutputCount(request, &count));
  for (uint32_t i = 0; failure.empty() && i < count; ++i) {
    const char* name = nullptr;
    failure = Failure(TRITONBACKEND_RequestOutputName(request, i, &name));
    if (failure.empty()) stream->requested.insert(name);
  }
  if (failure.empty()) {
    failure = Failure(TRITONSERVER_InferenceRequestNew(&stream->child, server_, python_model_.c_str(), -1));
  }
  if (!failure.empty()) return failure;
  TRITONSERVER_InferenceRequest* child = stream->child;
  failure = CopyRequest(request, child, {kStreamParameter, kSocketParameter, kTokenParameter});
  if (failure.empty()) {
    failure = Failure(TRITONSERVER_InferenceRequestSetIntParameter(child, kStreamParameter,
                                                                   static_cast<int64_t>(stream->id)));
  }
  if (failure.empty()) {
    failure = Failure(TRITONSERVER_InferenceRequestSetStringParameter(child, kSocketParameter, socket_path_.c_str()));
  }
  if (failure.empty()) {
    failure = Failure(TRITONSERVER_InferenceRequestSetStringParameter(child, kTokenParameter, Hex(stream->token).c_str()));
  }
  if (failure.empty()) failure = Failure(TRITONSERVER_InferenceRequestSetReleaseCallback(child, OnChildReleased, stream));
  if (failure.empty()) {
    failure = Failure(TRITONSERVER_InferenceRequestSetResponseCallback(child, allocator_, nullptr, OnChildResponse, stream));
  }
  if (failure.empty()) {
    // From here Triton owns the child, and its callbacks may run before InferAsync returns.
    {
      std::lock_guard<std::recursive_mutex> lock(mutex_);
      stream->child_started = true;
    }
    failure = Failure(TRITONSERVER_ServerInferAsync(server_, child, nullptr));
    if (failure.empty()) return "";
    failure = python_model_ + ": " + failure;
  }
  return failure;
}

void Relay::OnChildResponse(TRITONSERVER_InferenceResponse* response, const uint32_t flags, void* userp) {
  Stream* stream = static_cast<Stream*>(userp);
  Relay* relay = stream->relay;
  std::vector<Finished> to_release;
  bool wake = false;
  {
    std::lock_guard<std::recursive_mutex> lock(relay->mutex_);
    TRITONSERVER_Error* error = response == nullptr ? nullptr : TRITONSERVER_InferenceResponseError(response);
    if (error != nullptr && stream->factory != nullptr) {  // owned by the response: not deleted here
      relay->SendError(stream, TRITONSERVER_ErrorCode(error), TRITONSERVER_ErrorMessage(error));
    }
    if (response != nullptr) LogFailure(TRITONSERVER_InferenceResponseDelete(response), "child response");
    if ((flags & TRITONSERVER_RESPONSE_COMPLETE_FINAL) != 0) {
      stream->child_complete = true;
      stream->completion = ++relay->completions_;
      // Its final frame was written before the child completed: the reader finds it or ends the stream.
      wake = stream->factory != nullptr;
      relay->ReleaseIfDone(stream, &to_release);
    }
  }
  if (wake) (void)!write(relay->wake_[1], "c", 1);
  ReleaseAll(to_release);
}

void Relay::OnChildReleased(TRITONSERVER_InferenceRequest*, const uint32_t, void* userp) {
  Stream* stream = static_cast<Stream*>(userp);
  Relay* relay = stream->relay;
  std::vector<Finished> to_release;
  {
    std::lock_guard<std::recursive_mutex> lock(relay->mutex_);
    stream->child_released = true;
    relay->ReleaseIfDone(stream, &to_release);
  }
  ReleaseAll(to_release);
}

// Once the child is released and complete, it is deleted; once the stream's final response has gone too, the
// client's request is released (the child read its inputs; its statistics say how the stream ended) and the
// stream forgotten. Triton destroys a model on a thread of its own, so a release here never unloads under us.
void Relay::ReleaseIfDone(Stream* stream, std::vector<Finished>* to_release) {
  if (stream->child != nullptr && stream->child_released && stream->child_complete) {
    LogFailure(TRITONSERVER_InferenceRequestDelete(stream->child), "child request");
    stream->child = nullptr;
  }
  if (stream->request != nullptr && stream->child == nullptr && stream->child_complete && stream->factory == nullptr) {
    to_release->push_back({stream->instance, stream->request, !stream->failed, stream->arrived_ns});
    stream->request = nullptr;
  }
  if (stream->request == nullptr && stream->factory == nullptr) streams_.erase(stream->id);
}

void Relay::End(Stream* stream) {
  LogFailure(TRITONBACKEND_ResponseFactoryDelete(stream->factory), "response factory");
  stream->factory = nullptr;
}

void Relay::SendError(Stream* stream, TRITONSERVER_Error_Code code, const std::string& message) {
  stream->failed = true;
  SendFinalError(stream->factory, code, message);
  End(stream);
}

// A response frame's outputs (checked whole by ParseFrame), sent on the stream's factory (final for kind 1).
void Relay::SendFrame(Stream* stream, const Frame& frame, const std::vector<char>& body) {
  const uint32_t flags = frame.kind == kFinalResponse ? uint32_t{TRITONSERVER_RESPONSE_COMPLETE_FINAL} : 0;
  if (frame.tensors.empty()) {
    if (flags != 0) {
      LogFailure(TRITONBACKEND_ResponseFactorySendFlags(stream->factory, flags), "final");
      End(stream);
    }
    return;
  }
  TRITONBACKEND_Response* response = nullptr;
  std::string failure = Failure(TRITONBACKEND_ResponseNewFromFactory(&response, stream->factory));
  if (!failure.empty()) {
    SendError(stream, TRITONSERVER_ERROR_INTERNAL, model_name_ + ": " + failure);
    return;
  }
  for (const FrameTensor& tensor : frame.tensors) {
    if (!failure.empty()) break;
    if (stream->requested.count(tensor.name) == 0) continue;
    TRITONBACKEND_Output* output = nullptr;
    void* buffer = nullptr;
    TRITONSERVER_MemoryType memory_type = TRITONSERVER_MEMORY_CPU;
    int64_t memory_type_id = 0;
    failure = Failure(TRITONBACKEND_ResponseOutput(response, &output, tensor.name.c_str(), tensor.datatype,
                                                   tensor.shape.data(), static_cast<uint32_t>(tensor.shape.size())));
    // A buffer even for an empty tensor (a stopped stream's last output_ids), as the Python backend asks for one:
    // Triton's gRPC frontend adds a tensor's raw contents when its buffer is allocated, and a response with an
    // output but no contents fails in the client ("response output count mismatch").
    if (failure.empty()) {
      failure = Failure(TRITONBACKEND_OutputBuffer(output, &buffer, tensor.length, &memory_type, &memory_type_id));
      if (failure.empty() && tensor.length > 0 && memory_type != TRITONSERVER_MEMORY_CPU &&
          memory_type != TRITONSERVER_MEMORY_CPU_PINNED) {
        failure = "output " + tensor.name + " was given memory outside the CPU";
      }
      if (failure.empty() && tensor.length > 0) std::memcpy(buffer, body.data() + tensor.data, tensor.length);
    }
  }
  TRITONSERVER_Error* error =
      failure.empty() ? nullptr : TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INTERNAL, (model_name_ + ": " + failure).c_str());
  const uint32_t send_flags = error != nullptr ? uint32_t{TRITONSERVER_RESPONSE_COMPLETE_FINAL} : flags;
  const std::string send_failure = Failure(TRITONBACKEND_ResponseSend(response, send_flags, error));
  if (error != nullptr) TRITONSERVER_ErrorDelete(error);
  if (!send_failure.empty()) {
    // The client has most likely gone; the stream still ends once, with the final flag.
    Log(TRITONSERVER_LOG_VERBOSE, "a response could not be sent: " + send_failure);
    if (send_flags == 0) return;
    LogFailure(TRITONBACKEND_ResponseFactorySendFlags(stream->factory, TRITONSERVER_RESPONSE_COMPLETE_FINAL), "final");
  }
  if (send_flags != 0) End(stream);
}

// A frame of kinds 0-3 from `connection`; "" when it may send it, else why the connection is closed.
std::string Relay::HandleStreamFrame(const Frame& frame, const std::vector<char>& body, Connection* connection) {
  std::vector<Finished> to_release;
  {
    std::lock_guard<std::recursive_mutex> lock(mutex_);
    auto found = streams_.find(frame.stream);
    if (found == streams_.end()) {
      // Forgotten once its request was released: a late frame has nothing left to affect.
      if (frame.stream != 0 && frame.stream < next_stream_) return "";
      return "a frame for stream " + std::to_string(frame.stream) + ", which was never handed out";
    }
    Stream* stream = found->second.get();
    if (frame.kind == kClaim) {
      if (!SameToken(frame.token, stream->token)) return "a claim of stream " + std::to_string(stream->id) +
                                                         " with the wrong token";
      if (stream->connection != 0 && stream->connection != connection->serial) {
        return "a claim of stream " + std::to_string(stream->id) + ", which another connection claimed";
      }
      stream->connection = connection->serial;
      // Cancelled before its claim: by its client, or ended by a shutdown (which leaves no factory).
      if (stream->cancel_passed_on) TellCancelled(*stream);
      return "";
    }
    if (stream->connection != connection->serial) {
      return "a frame for stream " + std::to_string(stream->id) + ", which " +
             (stream->connection == 0 ? "it has not claimed" : "another connection claimed");
    }
    if (stream->factory == nullptr) return "";  // ended here already (its client's error, a failure)
    if (frame.kind == kError) {
      SendError(stream, frame.code, frame.message);
    } else {
      SendFrame(stream, frame, body);
    }
    ReleaseIfDone(stream, &to_release);
  }
  ReleaseAll(to_release);
  return "";
}

size_t Relay::EndStreams(const std::function<bool(const Stream&)>& matches, TRITONSERVER_Error_Code code,
                         const std::string& message) {
  std::vector<Finished> to_release;
  std::vector<Stream*> ending;
  {
    std::lock_guard<std::recursive_mutex> lock(mutex_);
    for (auto& entry : streams_) {
      if (entry.second->factory != nullptr && matches(*entry.second)) ending.push_back(entry.second.get());
    }
    for (Stream* stream : ending) {
      SendError(stream, code, message);
      ReleaseIfDone(stream, &to_release);
    }
  }
  ReleaseAll(to_release);
  return ending.size();
}

void Relay::PassOnCancellations() {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  for (auto& entry : streams_) {
    Stream* stream = entry.second.get();
    if (stream->cancel_passed_on || stream->factory == nullptr || !stream->child_started || stream->child_complete) {
      continue;
    }
    bool cancelled = false;
    LogFailure(TRITONBACKEND_ResponseFactoryIsCancelled(stream->factory, &cancelled), "cancellation");
    if (cancelled) {
      Log(TRITONSERVER_LOG_VERBOSE, "the client of stream " + std::to_string(stream->id) + " cancelled it");
      stream->cancel_passed_on = true;
      LogFailure(TRITONSERVER_InferenceRequestCancel(stream->child), "cancelling the child request");
      if (stream->connection != 0) TellCancelled(*stream);  // else when its process claims it
    }
  }
}

void Relay::EndForShutdown() {
  exiting_ = true;
  {
    std::lock_guard<std::recursive_mutex> lock(mutex_);
    for (auto& entry : streams_) {
      Stream* stream = entry.second.get();
      if (stream->cancel_passed_on || stream->child_complete) continue;
      stream->cancel_passed_on = true;
      if (stream->child_started) {
        LogFailure(TRITONSERVER_InferenceRequestCancel(stream->child), "cancelling the child request");
      }
      if (stream->connection != 0) TellCancelled(*stream);  // else when its process claims it
    }
  }
  CancelEngineCalls();
  const size_t ended = EndStreams([](const Stream&) { return true; }, TRITONSERVER_ERROR_UNAVAILABLE,
                                  model_name_ + ": " + kShutdownMessage);
  Log(TRITONSERVER_LOG_INFO, model_name_ + ": tritonserver is shutting down; " + std::to_string(ended) +
                                 " streams still running ended with an error, their engine requests cancelled");
}

// Tells the stream's process that its client cancelled it (with the lock held).
void Relay::TellCancelled(const Stream& stream) { Queue(stream.connection, CancelledFrame(stream.id)); }

}  // namespace llama3_relay
