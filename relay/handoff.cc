// The handoff (handoff.h): the ensemble's requests forwarded to the engine, the engine's responses re-sent from the
// sender threads.
#include "handoff.h"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <iterator>
#include <unordered_map>

#include "merge.h"

namespace llama3_relay {

namespace {
// The stream-state output (bls/contract.py HANDOFF_TEXT_STATE), sent to a request that asks for it, in the responses
// NeedsTextState names: the stream's preceding ids, then kTextEnd where the response ends the stream's text (ids are
// never negative).
constexpr char kPrecedingIds[] = "preceding_ids";
constexpr int32_t kTextEnd = -1;  // bls/contract.py TEXT_END
// Ids kept per stream (bls/text/detokenizer.py PRECEDING_TOKENS says why this many).
constexpr size_t kPrecedingTokens = 8;
// A byte per token id, in the version folder (bls/contract.py TOKEN_TEXT_CLASSES_FILE, written by make repo).
constexpr char kTokenTextClassesFile[] = "token_text_classes.bin";
// What a token's bytes are to a UTF-8 stream: its byte in the file (bls/contract.py TokenTextClass: 0 whole
// characters or no bytes, 1 part of a character; any other byte is refused at load).
constexpr uint8_t kPartial = 1;
}  // namespace

struct HandoffStream {
  Handoff* handoff = nullptr;
  TRITONBACKEND_ModelInstance* instance = nullptr;  // reports the request's statistics
  TRITONBACKEND_Request* request = nullptr;  // the ensemble's: its inputs back the engine request's
  TRITONBACKEND_ResponseFactory* factory = nullptr;  // null once the final response has gone
  TRITONSERVER_InferenceRequest* engine_request = nullptr;
  size_t sender = 0;  // every response of the stream goes through this sender, in order
  uint64_t arrived_ns = 0;
  bool failed = false;
  bool cancel_passed_on = false;
  // The stream is one sequence: batch 1, beam width 1, one return sequence. Only such a stream's responses merge
  // (merge.h): those of different sequences never do, whatever outputs they carry.
  bool one_sequence = false;
  // The request asked for the stream-state output (the ensemble does), streams, and is one sequence; the FINAL flag
  // then ends the sequence. Any other stream gets no state, so postprocessing decodes each response alone, as
  // NVIDIA's does.
  bool exact_text = false;
  // The stream has met a token that is part of a character: from then on every response carries the state.
  bool stateful = false;
  std::vector<int32_t> preceding;  // the last ids forwarded (exact_text), at most kPrecedingTokens
  std::vector<int32_t> state;  // the output's data, reused from response to response
  RequestTiming timing;
  // The final response sent and the engine request released: the second of the two forgets the stream.
  std::atomic<int> remaining{2};
};

namespace {

void SendError(HandoffStream* stream, TRITONSERVER_Error_Code code, const std::string& message) {
  stream->failed = true;
  SendFinalError(stream->factory, code, message);
}

// A new output of `response` holding `byte_size` bytes from `data`; "" or why not.
std::string AddOutput(TRITONBACKEND_Response* response, const char* name, TRITONSERVER_DataType datatype,
                      const int64_t* shape, uint32_t dims, const void* data, size_t byte_size) {
  TRITONBACKEND_Output* output = nullptr;
  std::string failure = Failure(TRITONBACKEND_ResponseOutput(response, &output, name, datatype, shape, dims));
  void* buffer = nullptr;
  TRITONSERVER_MemoryType buffer_type = TRITONSERVER_MEMORY_CPU;
  int64_t buffer_type_id = 0;
  // A buffer even for no bytes: Triton's ensemble takes an output's data from its allocation (core's
  // EnsembleContext::ResponseComplete); an empty preceding_ids never allocated crashed tritonserver 2.51 there.
  if (failure.empty()) {
    failure = Failure(TRITONBACKEND_OutputBuffer(output, &buffer, byte_size, &buffer_type, &buffer_type_id));
    // The ensemble's buffers are in CPU memory (its allocator honours the preferred type, CPU here).
    if (failure.empty() && buffer_type == TRITONSERVER_MEMORY_GPU) {
      failure = std::string("output ") + name + " got GPU memory";
    }
    if (failure.empty() && byte_size != 0) std::memcpy(buffer, data, byte_size);
  }
  return failure;
}

// Whether this response carries the stream's state: from the stream's first token that is part of a character on
// (kPartial), every response does. Before it every token was whole characters or no bytes, so nothing is pending and
// each response decoded alone is exact. Why not only the responses around a split character: postprocessing's
// dynamic batcher puts requests with and without an optional input in different batches (core's
// dynamic_batch_scheduler.cc, RequiredEqualInputs), so a stream switching back and forth would break its batches at
// every switch (docs/benchmarks.md). An id outside the table is kPartial (postprocessing refuses it).
bool NeedsTextState(HandoffStream* stream, const std::vector<int32_t>& ids, const std::vector<uint8_t>& classes) {
  for (const int32_t id : ids) {
    if (stream->stateful) break;
    stream->stateful = id < 0 || static_cast<size_t>(id) >= classes.size() || classes[id] == kPartial;
  }
  return stream->stateful;
}

// An exact-text stream's response about to be sent with the engine's `ids`: the stream-state output where
// NeedsTextState says ([1, 1, n]: the preceding ids, then kTextEnd on the final response), and the stream's preceding
// ids moved past `ids`; "" or why not. Where it is left out, Triton's ensemble gives postprocessing no PRECEDING_IDS
// (core's EnsembleContext::ResponseComplete: an output a response leaves out is an optional input left out, since
// Triton 24.01), and the response is decoded alone.
std::string AddTextState(HandoffStream* stream, TRITONBACKEND_Response* response, const std::vector<int32_t>& ids,
                         bool final, const std::vector<uint8_t>& classes) {
  std::string failure;
  if (NeedsTextState(stream, ids, classes)) {
    std::vector<int32_t>& state = stream->state;
    state.assign(stream->preceding.begin(), stream->preceding.end());
    if (final) state.push_back(kTextEnd);
    const int64_t shape[3] = {1, 1, static_cast<int64_t>(state.size())};
    failure = AddOutput(response, kPrecedingIds, TRITONSERVER_TYPE_INT32, shape, 3, state.data(),
                        state.size() * sizeof(int32_t));
  }
  std::vector<int32_t>& kept = stream->preceding;
  kept.insert(kept.end(), ids.begin(), ids.end());
  if (kept.size() > kPrecedingTokens) kept.erase(kept.begin(), kept.end() - kPrecedingTokens);
  return failure;
}

// The outputs of one engine response, or of several merged into one (merge.h), in a response of the stream's,
// sent with `flags`; "" or why not.
std::string Resend(HandoffStream* stream, const std::vector<const EngineOutputs*>& engine_responses, uint32_t flags,
                   const std::vector<uint8_t>& token_classes) {
  TRITONBACKEND_Response* response = nullptr;
  std::string failure = Failure(TRITONBACKEND_ResponseNewFromFactory(&response, stream->factory));
  std::vector<int32_t> ids;
  if (engine_responses.size() == 1) {  // as the engine sent it (the engine's outputs are on the heap: our allocator)
    for (const ResponseOutput& output : *engine_responses.front()) {
      if (failure.empty()) {
        failure = AddOutput(response, output.name, output.datatype, output.shape, static_cast<uint32_t>(output.dims),
                            output.base, output.byte_size);
      }
    }
    if (stream->exact_text) ids = FirstBeamIds(*engine_responses.front());
  } else {
    MergedResponse merged;
    Merge(engine_responses, &merged);
    for (const MergedOutput& output : merged.outputs) {
      if (failure.empty()) {
        failure = AddOutput(response, output.name, output.datatype, output.shape.data(),
                            static_cast<uint32_t>(output.shape.size()), output.data, output.byte_size);
      }
    }
    ids = std::move(merged.ids);  // exact text: the merged ids, as one response's
  }
  const bool final = (flags & TRITONSERVER_RESPONSE_COMPLETE_FINAL) != 0;
  if (failure.empty() && stream->exact_text) failure = AddTextState(stream, response, ids, final, token_classes);
  if (failure.empty()) {
    failure = Failure(TRITONBACKEND_ResponseSend(response, flags & TRITONSERVER_RESPONSE_COMPLETE_FINAL, nullptr));
  } else if (response != nullptr) {
    LogFailure(TRITONBACKEND_ResponseDelete(response), "response");
  }
  return failure;
}

// The request's correlation id, a number or a string (the backend API reads each kind apart); "" or why not.
std::string CopyCorrelationId(TRITONBACKEND_Request* from, TRITONSERVER_InferenceRequest* to) {
  uint64_t number = 0;
  TRITONSERVER_Error* not_a_number = TRITONBACKEND_RequestCorrelationId(from, &number);
  if (not_a_number == nullptr) {
    return number == 0 ? "" : Failure(TRITONSERVER_InferenceRequestSetCorrelationId(to, number));
  }
  TRITONSERVER_ErrorDelete(not_a_number);
  const char* text = nullptr;
  std::string failure = Failure(TRITONBACKEND_RequestCorrelationIdString(from, &text));
  if (failure.empty() && text != nullptr && text[0] != '\0') {
    failure = Failure(TRITONSERVER_InferenceRequestSetCorrelationIdString(to, text));
  }
  return failure;
}

// The first element of input `name` as T, if the request has it in CPU memory.
template <typename T>
bool ReadScalar(TRITONBACKEND_Request* request, const char* name, T* value) {
  TRITONBACKEND_Input* input = nullptr;
  TRITONSERVER_Error* absent = TRITONBACKEND_RequestInput(request, name, &input);
  if (absent != nullptr) {
    TRITONSERVER_ErrorDelete(absent);
    return false;
  }
  const void* buffer = nullptr;
  uint64_t byte_size = 0;
  TRITONSERVER_MemoryType memory_type = TRITONSERVER_MEMORY_CPU;
  int64_t memory_type_id = 0;
  if (!Failure(TRITONBACKEND_InputBuffer(input, 0, &buffer, &byte_size, &memory_type, &memory_type_id)).empty() ||
      byte_size < sizeof(T) || memory_type == TRITONSERVER_MEMORY_GPU) {
    return false;
  }
  std::memcpy(value, buffer, sizeof(T));
  return true;
}

// The batch size of the request (its input_lengths' first dimension), 0 if unknown.
int64_t BatchSize(TRITONBACKEND_Request* request) {
  TRITONBACKEND_Input* input = nullptr;
  TRITONSERVER_Error* absent = TRITONBACKEND_RequestInput(request, "input_lengths", &input);
  if (absent != nullptr) {
    TRITONSERVER_ErrorDelete(absent);
    return 0;
  }
  const int64_t* shape = nullptr;
  uint32_t dims = 0;
  if (!Failure(TRITONBACKEND_InputProperties(input, nullptr, nullptr, &shape, &dims, nullptr, nullptr)).empty() ||
      dims == 0) {
    return 0;
  }
  return shape[0];
}

// The token classes `make repo` wrote beside the library (kTokenTextClassesFile): a byte per id, each a
// TokenTextClass.
TRITONSERVER_Error* ReadTokenTextClasses(TRITONBACKEND_Model* model, std::vector<uint8_t>* classes) {
  TRITONBACKEND_ArtifactType artifact_type = TRITONBACKEND_ARTIFACT_FILESYSTEM;
  const char* location = nullptr;
  uint64_t version = 0;
  TRITONSERVER_Error* error = TRITONBACKEND_ModelRepository(model, &artifact_type, &location);
  if (error == nullptr) error = TRITONBACKEND_ModelVersion(model, &version);
  if (error != nullptr) return error;
  const std::string path = std::string(location) + "/" + std::to_string(version) + "/" + kTokenTextClassesFile;
  std::ifstream file(path, std::ios::binary);
  if (file) classes->assign(std::istreambuf_iterator<char>(file), std::istreambuf_iterator<char>());
  if (classes->empty()) {
    return InvalidConfig("cannot read " + path + " (each token's text class, written by make repo): rebuild the "
                         "repository with make repo");
  }
  if (std::any_of(classes->begin(), classes->end(), [](uint8_t token_class) { return token_class > kPartial; })) {
    return InvalidConfig(path + " holds a byte that is no token text class: rebuild the repository with make repo");
  }
  return nullptr;
}

}  // namespace

TRITONSERVER_Error* Handoff::Create(TRITONBACKEND_Model* model, const std::string& engine, uint32_t sender_threads,
                                    const std::string& metrics_model, Handoff** out) {
  std::unique_ptr<Handoff> handoff(new Handoff());
  const char* name = nullptr;
  TRITONSERVER_Error* error = TRITONBACKEND_ModelName(model, &name);
  if (error != nullptr) return error;
  handoff->model_name_ = name;
  if (engine == handoff->model_name_) return InvalidConfig("handoff_to names this model itself (" + engine + ")");
  if (sender_threads == 0) return InvalidConfig("sender_threads must be at least 1");
  handoff->engine_ = engine;
  error = TRITONBACKEND_ModelServer(model, &handoff->server_);
  if (error != nullptr) return error;
  error = ReadTokenTextClasses(model, &handoff->token_classes_);
  if (error != nullptr) return error;
  error = NewEngineAllocator(&handoff->allocator_);
  if (error != nullptr) return error;
  if (!metrics_model.empty()) {
    handoff->metrics_ = std::make_unique<RequestMetrics>();
    const std::string failure = handoff->metrics_->Create(metrics_model);
    if (!failure.empty()) {  // serving matters more than its metrics: load, and say what is missing
      Log(TRITONSERVER_LOG_WARN, handoff->model_name_ + ": no request metrics for " + metrics_model + ": " + failure);
      handoff->metrics_.reset();
    }
  }
  for (uint32_t i = 0; i < sender_threads; ++i) {
    handoff->senders_.push_back(std::make_unique<Sender>());
    Sender* sender = handoff->senders_.back().get();
    sender->thread = std::thread([raw = handoff.get(), sender] { raw->Send(sender); });
    // The bench counts these threads' CPU by name (testkit/processes.py).
    pthread_setname_np(sender->thread.native_handle(), "handoff_sender");
  }
  handoff->exit_watch_ = std::thread([raw = handoff.get()] { raw->WatchForShutdown(); });
  pthread_setname_np(handoff->exit_watch_.native_handle(), "handoff_exit");
  Log(TRITONSERVER_LOG_INFO, handoff->model_name_ + ": forwards to " + engine + ", its responses re-sent from " +
                                 std::to_string(sender_threads) + " sender thread(s)");
  *out = handoff.release();
  return nullptr;
}

Handoff::~Handoff() {
  {
    std::lock_guard<std::mutex> lock(live_mutex_);
    stopping_ = true;
  }
  stop_watch_.notify_all();
  if (exit_watch_.joinable()) exit_watch_.join();
  for (auto& sender : senders_) {
    {
      std::lock_guard<std::mutex> lock(sender->mutex);
    }
    sender->ready.notify_all();
    sender->room.notify_all();
  }
  for (auto& sender : senders_) {
    if (sender->thread.joinable()) sender->thread.join();
  }
  if (allocator_ != nullptr) LogFailure(TRITONSERVER_ResponseAllocatorDelete(allocator_), "allocator");
}

void Handoff::WatchForShutdown() {
  std::unique_lock<std::mutex> lock(live_mutex_);
  while (!stop_watch_.wait_for(lock, kCancellationPeriod, [this] { return stopping_.load(); })) {
    if (!ServerExiting(server_)) continue;
    exiting_ = true;
    // The lock keeps each stream (and its engine request) from Done until it is cancelled.
    for (HandoffStream* stream : live_) {
      LogFailure(TRITONSERVER_InferenceRequestCancel(stream->engine_request), "cancelling the engine request");
    }
    Log(TRITONSERVER_LOG_INFO, model_name_ + ": tritonserver is shutting down; the engine requests of " +
                                   std::to_string(live_.size()) + " streams still running were cancelled");
    return;
  }
}

bool Handoff::StopAll() {
  // Triton unloads a model once its requests are released, and a stream's request is released last: what is left
  // is at most a sender returning from it.
  const auto deadline = std::chrono::steady_clock::now() + kUnloadWait;
  while (in_flight_ != 0) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

void Handoff::Execute(TRITONBACKEND_ModelInstance* instance, TRITONBACKEND_Request** requests, uint32_t count) {
  const uint64_t start = NowNs();
  for (uint32_t i = 0; i < count; ++i) Forward(instance, requests[i]);
  const uint64_t end = NowNs();
  LogFailure(TRITONBACKEND_ModelInstanceReportBatchStatistics(instance, count, start, start, end, end), "statistics");
}

void Handoff::Forward(TRITONBACKEND_ModelInstance* instance, TRITONBACKEND_Request* request) {
  auto stream = std::make_unique<HandoffStream>();
  stream->handoff = this;
  stream->instance = instance;
  stream->request = request;
  stream->arrived_ns = NowNs();
  stream->sender = next_stream_++ % senders_.size();
  if (metrics_ != nullptr) ReadTiming(stream.get());
  const std::string factory_failure = Failure(TRITONBACKEND_ResponseFactoryNew(&stream->factory, request));
  if (!factory_failure.empty()) {  // no way to answer: Triton fails a request released without a response
    Log(TRITONSERVER_LOG_ERROR, "cannot answer a request: " + factory_failure);
    LogFailure(TRITONBACKEND_RequestRelease(request, TRITONSERVER_REQUEST_RELEASE_ALL), "release");
    return;
  }
  ++in_flight_;
  bool cancelled = false;
  LogFailure(TRITONBACKEND_RequestIsCancelled(request, &cancelled), "cancellation");
  TRITONSERVER_Error_Code code = TRITONSERVER_ERROR_CANCELLED;
  std::string failure;
  if (cancelled) {
    failure = "the request was cancelled";
  } else if (exiting_) {  // requests still come while Triton's frontends drain: refused
    code = TRITONSERVER_ERROR_UNAVAILABLE;
    failure = model_name_ + ": " + kShutdownMessage;
  } else {
    failure = Start(stream.get(), &code);
  }
  if (failure.empty()) {
    stream.release();  // the engine's callbacks own it now
    return;
  }
  if (stream->engine_request != nullptr) {  // Triton did not take it: ours to delete
    LogFailure(TRITONSERVER_InferenceRequestDelete(stream->engine_request), "engine request");
  }
  SendError(stream.get(), code, failure);
  LogFailure(TRITONBACKEND_ResponseFactoryDelete(stream->factory), "response factory");
  ReleaseAll({{instance, request, false, stream->arrived_ns}});
  --in_flight_;
}

std::string Handoff::Start(HandoffStream* stream, TRITONSERVER_Error_Code* code) {
  TRITONBACKEND_Request* request = stream->request;
  *code = TRITONSERVER_ERROR_UNAVAILABLE;
  std::string failure = Failure(TRITONSERVER_InferenceRequestNew(&stream->engine_request, server_, engine_.c_str(), -1));
  TRITONSERVER_InferenceRequest* engine_request = stream->engine_request;
  if (failure.empty()) {
    failure = CopyRequest(request, engine_request, {});
    if (failure.rfind("INVALID:", 0) == 0) {  // the client's own mistake
      *code = TRITONSERVER_ERROR_INVALID_ARG;
      return failure.substr(8);
    }
  }
  uint32_t count = 0;
  bool text_state = false;  // the request asked for the stream-state output
  if (failure.empty()) failure = Failure(TRITONBACKEND_RequestOutputCount(request, &count));
  for (uint32_t i = 0; failure.empty() && i < count; ++i) {
    const char* name = nullptr;
    failure = Failure(TRITONBACKEND_RequestOutputName(request, i, &name));
    if (failure.empty() && std::strcmp(name, kPrecedingIds) == 0) {  // ours, not the engine's
      text_state = true;
      continue;
    }
    if (failure.empty()) failure = Failure(TRITONSERVER_InferenceRequestAddRequestedOutput(engine_request, name));
  }
  if (failure.empty()) {
    bool streaming = false;
    int32_t beam_width = 1;
    int32_t sequences = 1;
    ReadScalar(request, "streaming", &streaming);
    ReadScalar(request, "beam_width", &beam_width);
    ReadScalar(request, "num_return_sequences", &sequences);
    stream->one_sequence = BatchSize(request) == 1 && beam_width <= 1 && sequences <= 1;
    stream->exact_text = text_state && streaming && stream->one_sequence;
  }
  if (failure.empty()) failure = CopyCorrelationId(request, engine_request);
  uint32_t flags = 0;
  uint64_t timeout_us = 0;
  if (failure.empty()) failure = Failure(TRITONBACKEND_RequestFlags(request, &flags));
  if (failure.empty()) failure = Failure(TRITONSERVER_InferenceRequestSetFlags(engine_request, flags));
  if (failure.empty()) failure = Failure(TRITONBACKEND_InferenceRequestTimeoutMicroseconds(request, &timeout_us));
  if (failure.empty() && timeout_us != 0) {
    failure = Failure(TRITONSERVER_InferenceRequestSetTimeoutMicroseconds(engine_request, timeout_us));
  }
  if (failure.empty()) {
    failure = Failure(TRITONSERVER_InferenceRequestSetReleaseCallback(engine_request, OnEngineReleased, stream));
  }
  if (failure.empty()) {
    failure = Failure(
        TRITONSERVER_InferenceRequestSetResponseCallback(engine_request, allocator_, nullptr, OnEngineResponse, stream));
  }
  if (!failure.empty()) return model_name_ + ": " + failure;
  // From here Triton owns the engine request, and its callbacks may run before InferAsync returns. A refusal (the
  // engine's queue full, an input it rejects, the engine not loaded) goes to the client as Triton words it.
  {
    std::lock_guard<std::mutex> lock(live_mutex_);
    live_.insert(stream);
  }
  TRITONSERVER_Error* refused = TRITONSERVER_ServerInferAsync(server_, engine_request, nullptr);
  if (refused == nullptr) return "";
  {
    std::lock_guard<std::mutex> lock(live_mutex_);
    live_.erase(stream);
  }
  *code = TRITONSERVER_ErrorCode(refused);
  failure = TRITONSERVER_ErrorMessage(refused);
  TRITONSERVER_ErrorDelete(refused);
  return failure.empty() ? engine_ + ": refused the request" : failure;
}

void Handoff::ReadTiming(HandoffStream* stream) {
  RequestTiming& timing = stream->timing;
  timing.arrived_ns = stream->arrived_ns;
  int32_t value = 0;
  if (ReadScalar(stream->request, "input_lengths", &value)) timing.prompt_tokens = value;
  if (ReadScalar(stream->request, "request_output_len", &value)) timing.max_tokens = value;
  bool flag = false;
  timing.streaming = ReadScalar(stream->request, "streaming", &flag) && flag;
  // A stream never repeats the prompt, whatever exclude_input_in_output says (TensorRT-LLM's LlmRequest::createResult
  // streams from the last token sent, which starts at the prompt's end), so only a unary response can.
  timing.prompt_in_output =
      !timing.streaming && (ReadScalar(stream->request, "exclude_input_in_output", &flag) ? !flag
                                                                                          : EngineRepeatsPrompt());
}

bool Handoff::EngineRepeatsPrompt() {
  std::lock_guard<std::mutex> lock(engine_config_mutex_);
  if (engine_repeats_prompt_ < 0) {
    TRITONSERVER_Message* message = nullptr;
    const char* json = nullptr;
    size_t size = 0;
    std::string failure = Failure(TRITONSERVER_ServerModelConfig(server_, engine_.c_str(), -1, 1, &message));
    if (failure.empty()) failure = Failure(TRITONSERVER_MessageSerializeToJson(message, &json, &size));
    if (failure.empty()) {
      // The backend's default when the parameter is not set: the prompt is repeated.
      engine_repeats_prompt_ = ConfigParameter(std::string(json, size), "exclude_input_in_output") != "true";
    }
    if (message != nullptr) LogFailure(TRITONSERVER_MessageDelete(message), "message");
    if (!failure.empty()) return false;  // not loaded yet: its requests fail anyway; read again next time
  }
  return engine_repeats_prompt_ == 1;
}

// On the engine's response thread: as little as can be.
void Handoff::OnEngineResponse(TRITONSERVER_InferenceResponse* response, const uint32_t flags, void* userp) {
  HandoffStream* stream = static_cast<HandoffStream*>(userp);
  Handoff* handoff = stream->handoff;
  Sender* sender = handoff->senders_[stream->sender].get();
  {
    std::unique_lock<std::mutex> lock(sender->mutex);
    sender->room.wait(lock, [&] { return sender->queue.size() < kMaxQueued || handoff->stopping_; });
    Delivery& delivery = sender->queue.emplace_back();
    delivery.stream = stream;
    delivery.response = response;
    delivery.flags = flags;
  }
  sender->ready.notify_one();
}

void Handoff::OnEngineReleased(TRITONSERVER_InferenceRequest*, const uint32_t, void* userp) {
  HandoffStream* stream = static_cast<HandoffStream*>(userp);
  stream->handoff->Done(stream);
}

void Handoff::Send(Sender* sender) {
  std::deque<Delivery> batch;
  std::vector<std::vector<Delivery*>> groups;  // each sent as one response, in the order of its first delivery
  std::unordered_map<HandoffStream*, size_t> open;  // a stream's group that the stream's next response may join
  while (true) {
    {
      std::unique_lock<std::mutex> lock(sender->mutex);
      sender->ready.wait(lock, [&] { return stopping_ || !sender->queue.empty(); });
      if (sender->queue.empty()) return;  // stopping, nothing left
      batch.swap(sender->queue);
    }
    sender->room.notify_all();
    // Only what waits together merges: a stream whose responses each find the sender idle gets each alone.
    for (Delivery& delivery : batch) {
      ReadOutputs(&delivery);
      const auto joined = open.find(delivery.stream);
      if (joined != open.end() && delivery.mergeable &&
          MergesWith(groups[joined->second].front()->outputs, delivery.outputs)) {
        groups[joined->second].push_back(&delivery);
      } else {
        groups.push_back({&delivery});
        open[delivery.stream] = groups.size() - 1;
      }
      // Nothing joins a response that is not Mergeable (errors among them), nor follows a final one.
      if (!delivery.mergeable || (delivery.flags & TRITONSERVER_RESPONSE_COMPLETE_FINAL) != 0) {
        open.erase(delivery.stream);
      }
    }
    for (const std::vector<Delivery*>& group : groups) Deliver(group);
    groups.clear();
    open.clear();
    batch.clear();
  }
}

void Handoff::ReadOutputs(Delivery* delivery) {
  TRITONSERVER_InferenceResponse* response = delivery->response;
  if (response == nullptr || TRITONSERVER_InferenceResponseError(response) != nullptr) return;
  uint32_t count = 0;
  delivery->failure = Failure(TRITONSERVER_InferenceResponseOutputCount(response, &count));
  delivery->outputs.resize(count);
  for (uint32_t i = 0; delivery->failure.empty() && i < count; ++i) {
    delivery->failure = ReadOutput(response, i, &delivery->outputs[i]);
  }
  // A response whose outputs could not all be read is sent as the error alone: none of its outputs is used.
  if (!delivery->failure.empty()) delivery->outputs.clear();
  delivery->mergeable = delivery->stream->one_sequence && delivery->failure.empty() && Mergeable(delivery->outputs);
}

void Handoff::Deliver(const std::vector<Delivery*>& group) {
  // One delivery, or several Mergeable ones of one stream, of which only the last may be final.
  const Delivery& last = *group.back();
  HandoffStream* stream = last.stream;
  const bool final = (last.flags & TRITONSERVER_RESPONSE_COMPLETE_FINAL) != 0;
  if (stream->factory != nullptr && exiting_) {
    // Its engine request was cancelled (WatchForShutdown), unless it started after: nobody reads the rest.
    if (!final) LogFailure(TRITONSERVER_InferenceRequestCancel(stream->engine_request), "cancelling the engine request");
    SendError(stream, TRITONSERVER_ERROR_UNAVAILABLE, model_name_ + ": " + kShutdownMessage);
    LogFailure(TRITONBACKEND_ResponseFactoryDelete(stream->factory), "response factory");
    stream->factory = nullptr;
  }
  if (stream->factory != nullptr) {
    bool cancelled = false;
    LogFailure(TRITONBACKEND_ResponseFactoryIsCancelled(stream->factory, &cancelled), "cancellation");
    if (cancelled && !final && !stream->cancel_passed_on) {
      stream->cancel_passed_on = true;
      LogFailure(TRITONSERVER_InferenceRequestCancel(stream->engine_request), "cancelling the engine request");
    }
    TRITONSERVER_Error* error = last.response == nullptr ? nullptr : TRITONSERVER_InferenceResponseError(last.response);
    if (error != nullptr) {  // owned by the response: not deleted here (never merged: the group is this alone)
      SendError(stream, TRITONSERVER_ErrorCode(error), TRITONSERVER_ErrorMessage(error));
    } else if (last.response != nullptr) {
      std::vector<const EngineOutputs*> responses;
      int64_t tokens = 0;
      for (const Delivery* delivery : group) {
        responses.push_back(&delivery->outputs);
        tokens += OutputTokens(delivery->outputs);
      }
      if (metrics_ != nullptr) {  // what the client receives: a merged response's tokens arrive together
        if (stream->timing.first_token_ns == 0 && stream->timing.prompt_in_output) {
          tokens -= stream->timing.prompt_tokens;
        }
        metrics_->OnTokens(&stream->timing, tokens, NowNs());
      }
      const std::string failure =
          last.failure.empty() ? Resend(stream, responses, last.flags, token_classes_) : last.failure;
      if (!failure.empty()) {
        SendError(stream, TRITONSERVER_ERROR_INTERNAL, model_name_ + ": " + failure);
        // Nobody reads the rest: the engine stops.
        if (!final) LogFailure(TRITONSERVER_InferenceRequestCancel(stream->engine_request), "cancelling the engine request");
      }
    } else if (final) {
      LogFailure(TRITONBACKEND_ResponseFactorySendFlags(stream->factory, TRITONSERVER_RESPONSE_COMPLETE_FINAL), "final");
    }
    if (final && !stream->failed && metrics_ != nullptr) {
      stream->timing.cancelled = cancelled || stream->cancel_passed_on;
      metrics_->OnFinished(stream->timing, NowNs());
    }
    // SendError ends the stream; so does the engine's final response.
    if (stream->failed || final) {
      LogFailure(TRITONBACKEND_ResponseFactoryDelete(stream->factory), "response factory");
      stream->factory = nullptr;
    }
  }
  for (const Delivery* delivery : group) {
    if (delivery->response != nullptr) {
      LogFailure(TRITONSERVER_InferenceResponseDelete(delivery->response), "engine response");
    }
  }
  if (final) Done(stream);
}

void Handoff::Done(HandoffStream* stream) {
  if (--stream->remaining != 0) return;
  {
    std::lock_guard<std::mutex> lock(live_mutex_);
    live_.erase(stream);
  }
  LogFailure(TRITONSERVER_InferenceRequestDelete(stream->engine_request), "engine request");
  ReleaseAll({{stream->instance, stream->request, !stream->failed, stream->arrived_ns}});
  delete stream;
  --in_flight_;
}

}  // namespace llama3_relay
