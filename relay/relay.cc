// llama3_relay: a Triton backend (C++) that fronts a Python-backend model and sends its responses for it.
//
// Why: a Python-backend model pays for every response it sends a synchronous round trip between its stub
// process and tritonserver (python_backend's ResponseSender::Send): 40-70 µs of stub CPU and about as much in
// tritonserver, per response. TensorRT-LLM's C++ backend sends one response per generated token per stream,
// so that cost, not the GPU, set the BLS's CPU per token (README, Benchmarks). Here the Python model keeps
// every decision (inputs, tokenization, streaming text, finish reasons, errors) and hands each response to
// this backend as a frame on a Unix socket, many frames to a write; this backend turns the frames into Triton
// responses from inside tritonserver.
//
// How a request goes:
// 1. The client's request (decoupled) arrives here. It is forwarded, inputs (by reference, no copy), request
//    id and parameters, as a child request to the Python model (config parameter `python_model_name`), with
//    two parameters of ours: kStreamParameter (this request's number) and kSocketParameter (where to connect).
// 2. The Python model writes the request's responses as frames to that socket, the last one final (a final
//    response or an error), then completes its child request with an empty final response. Frames of one
//    stream arrive in order on one connection; every Python process has its own connection.
// 3. Each frame becomes a response on the client's request; outputs the client did not ask for are dropped,
//    as the Python backend drops them.
// 4. A child that fails in Triton (model unloaded, stub died, queue full) ends the client's stream with its
//    error. A child that completes without a final frame (a bug) ends it with an internal error, never a hang.
// 5. The client's cancellation (checked every kCancellationPeriod) is passed on to the child request, and told
//    to the Python process that claimed the stream (a "cancelled" frame back on its connection), which stops its
//    engine request. Telling it saves the Python model a round trip to tritonserver per ask
//    (request.is_cancelled(), which a stream would otherwise pay every 100 ms: a tenth of its per-token CPU when a
//    token comes every 40 ms).
//
// 6. Engine calls: the Python model's own requests to the engine (tensorrt_llm, or its draft) go through the relay
//    too, on the same connection: the relay sends each as an in-process request (TRITONSERVER_ServerInferAsync)
//    and writes every engine response back as a frame, as it comes (one per generated token with TensorRT-LLM's
//    backend). Over the server's own HTTP endpoint each token cost the HTTP frontend's JSON and chunked
//    transfer, and the Python process a socket per stream to read (README, Benchmarks).
//
// Frame (little-endian), the Python half is bls/relay.py:
//   u32 length of the rest | u64 stream (an engine call's number for kinds 5-9: the Python process's) | u8 kind
//   Python -> relay: 0 response, 1 final response, 2 error (final), 3 claim (this connection sends the stream;
//                    written before any of its other frames), 5 engine request, 6 cancel an engine request
//   relay -> Python: 4 cancelled (the stream's client cancelled it; sent once, on the claiming connection),
//                    7 engine response, 8 final engine response, 9 engine error (final)
//   tensors:   u16 count, each: u16 name length, name, u8 datatype (TRITONSERVER_DataType), u8 dims,
//              i64 shape[dims], u64 data length, data (BYTES elements: u32 length + bytes each, as Triton's)
//   kind 0, 1, 7, 8: tensors (the outputs)
//   kind 2, 9: u32 code (TRITONSERVER_Error_Code), message (the rest)
//   kind 3, 4, 6: nothing more
//   kind 5:    u16 + model name, u16 + request id, u16 requested outputs (each u16 + name), tensors (the inputs)
// A final response without outputs only closes the stream (the final flag alone). Every engine call gets one
// final frame (8 or 9); after a cancel from Python, frames of that call may still come and are ignored there.
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "triton_c_api.h"

namespace {

constexpr const char* kStreamParameter = "llama3_relay_stream";
constexpr const char* kSocketParameter = "llama3_relay_socket";
constexpr auto kCancellationPeriod = std::chrono::milliseconds(100);
// The reader thread's name unless the config's `thread_name` parameter gives another: the bench's CPU accounting
// tells relays apart by it (testkit/processes.py), e.g. the BLS's from the one in front of the benchmark engine.
constexpr const char* kDefaultThreadName = "llama3_relay";
constexpr size_t kMaxThreadName = 15;  // Linux's limit, without the NUL
constexpr uint32_t kMaxFrameBytes = 1u << 30;  // a frame claiming more is a broken connection, not a response
enum FrameKind : uint8_t {
  kResponse = 0, kFinalResponse = 1, kError = 2, kClaim = 3, kCancelled = 4,
  kEngineRequest = 5, kEngineCancel = 6, kEngineResponse = 7, kEngineFinal = 8, kEngineError = 9,
};
constexpr auto kUnloadWait = std::chrono::seconds(30);  // for engine calls still running when the model unloads

void Log(TRITONSERVER_LogLevel level, const std::string& message) {
  TRITONSERVER_Error* error = TRITONSERVER_LogMessage(level, __FILE__, __LINE__, ("llama3_relay: " + message).c_str());
  if (error != nullptr) TRITONSERVER_ErrorDelete(error);
}

// A failed call's message (the error released), or "" when it succeeded.
std::string Failure(TRITONSERVER_Error* error) {
  if (error == nullptr) return "";
  std::string message = TRITONSERVER_ErrorMessage(error);
  TRITONSERVER_ErrorDelete(error);
  return message.empty() ? "unknown error" : message;
}

// For calls whose failure ends nothing more than itself.
void LogFailure(TRITONSERVER_Error* error, const char* what) {
  const std::string message = Failure(error);
  if (!message.empty()) Log(TRITONSERVER_LOG_ERROR, std::string(what) + ": " + message);
}

class Relay;

// One client request, from its arrival to its final response and the release of its child.
struct Stream {
  Relay* relay = nullptr;
  TRITONBACKEND_ModelInstance* instance = nullptr;  // reports the request's statistics
  uint64_t id = 0;
  uint64_t arrived_ns = 0;
  bool failed = false;  // ended with an error (Triton's success/failure counts)
  TRITONBACKEND_Request* request = nullptr;  // the client's: its inputs back the child's; released with it
  TRITONBACKEND_ResponseFactory* factory = nullptr;  // null once the final response has gone
  // Ours again once Triton has released it (the Python backend does when its execute returns), but kept until
  // the child completes: cancelling it then still reaches the Python model, whose response factory it shares.
  TRITONSERVER_InferenceRequest* child = nullptr;
  bool child_released = false;
  bool child_started = false;  // handed to Triton (only then can it be cancelled)
  std::unordered_set<std::string> requested;         // outputs the client asked for (Triton lists all if none)
  bool child_complete = false;  // the child's final response (or error) has come
  uint64_t completion = 0;  // when it came, in Relay::completions_ (which orphans a reader pass may end)
  bool cancel_passed_on = false;
  int connection = -1;  // the connection that claimed it (a stream's frames all come on one)
};

uint64_t NowNs() {  // the clock of Triton's own statistics
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// A client request whose child is done: its statistics go to Triton, then the request is released.
struct Finished {
  TRITONBACKEND_ModelInstance* instance;
  TRITONBACKEND_Request* request;
  bool success;
  uint64_t arrived_ns;
};

// Called without the relay's lock, as the last thing a callback does: once the last request is released the model
// may unload.
void ReleaseAll(const std::vector<Finished>& finished) {
  for (const Finished& done : finished) {
    const uint64_t now = NowNs();
    LogFailure(TRITONBACKEND_ModelInstanceReportStatistics(done.instance, done.request, done.success, done.arrived_ns,
                                                           done.arrived_ns, now, now),
               "statistics");
    LogFailure(TRITONBACKEND_RequestRelease(done.request, TRITONSERVER_REQUEST_RELEASE_ALL), "release");
  }
}

// Reads an integer of type T from the frame body at `at`, advancing it; false when the body is too short.
template <typename T>
bool Take(const std::vector<char>& body, size_t* at, T* value) {
  if (body.size() - *at < sizeof(T)) return false;
  std::memcpy(value, body.data() + *at, sizeof(T));
  *at += sizeof(T);
  return true;
}

// One tensor of a frame, its data at [data, data + length) of the frame's body.
struct FrameTensor {
  std::string name;
  uint8_t datatype = 0;
  uint8_t dims = 0;
  int64_t shape[16];
  size_t data = 0;
  uint64_t length = 0;
};

// Reads the tensor at `at`, advancing it; false when the body does not hold a whole and valid one.
bool TakeTensor(const std::vector<char>& body, size_t* at, FrameTensor* tensor) {
  uint16_t name_length = 0;
  if (!Take(body, at, &name_length) || body.size() - *at < name_length) return false;
  tensor->name.assign(body.data() + *at, name_length);
  *at += name_length;
  if (!Take(body, at, &tensor->datatype) || !Take(body, at, &tensor->dims) || tensor->dims > 16) return false;
  for (uint8_t d = 0; d < tensor->dims; ++d) {
    if (!Take(body, at, &tensor->shape[d])) return false;
  }
  if (!Take(body, at, &tensor->length) || body.size() - *at < tensor->length) return false;
  if (tensor->datatype <= TRITONSERVER_TYPE_INVALID || tensor->datatype > TRITONSERVER_TYPE_BF16) return false;
  tensor->data = *at;
  *at += tensor->length;
  return true;
}

bool TakeString(const std::vector<char>& body, size_t* at, std::string* value) {
  uint16_t length = 0;
  if (!Take(body, at, &length) || body.size() - *at < length) return false;
  value->assign(body.data() + *at, length);
  *at += length;
  return true;
}

template <typename T>
void Put(std::vector<char>* frame, T value) {
  const char* bytes = reinterpret_cast<const char*>(&value);
  frame->insert(frame->end(), bytes, bytes + sizeof(T));
}

// A frame's header; its length is set by FrameDone.
std::vector<char> FrameStart(uint64_t id, uint8_t kind) {
  std::vector<char> frame;
  Put<uint32_t>(&frame, 0);
  Put(&frame, id);
  Put(&frame, kind);
  return frame;
}

std::vector<char> FrameDone(std::vector<char> frame) {
  const uint32_t length = static_cast<uint32_t>(frame.size() - 4);
  std::memcpy(frame.data(), &length, 4);
  return frame;
}

std::vector<char> ErrorFrame(uint64_t id, uint8_t kind, TRITONSERVER_Error_Code code, const std::string& message) {
  std::vector<char> frame = FrameStart(id, kind);
  Put<uint32_t>(&frame, code);
  frame.insert(frame.end(), message.begin(), message.end());
  return FrameDone(std::move(frame));
}

// An engine response's outputs as a frame of `kind`; "" when they could be read, else why not.
std::string TensorFrame(uint64_t id, uint8_t kind, TRITONSERVER_InferenceResponse* response, std::vector<char>* out) {
  std::vector<char> frame = FrameStart(id, kind);
  uint32_t count = 0;
  std::string failure = response == nullptr ? "" : Failure(TRITONSERVER_InferenceResponseOutputCount(response, &count));
  Put(&frame, static_cast<uint16_t>(count));
  for (uint32_t i = 0; failure.empty() && i < count; ++i) {
    const char* name = nullptr;
    TRITONSERVER_DataType datatype = TRITONSERVER_TYPE_INVALID;
    const int64_t* shape = nullptr;
    uint64_t dims = 0;
    const void* base = nullptr;
    size_t byte_size = 0;
    TRITONSERVER_MemoryType memory_type = TRITONSERVER_MEMORY_CPU;
    int64_t memory_type_id = 0;
    void* userp = nullptr;
    failure = Failure(TRITONSERVER_InferenceResponseOutput(response, i, &name, &datatype, &shape, &dims, &base,
                                                           &byte_size, &memory_type, &memory_type_id, &userp));
    if (!failure.empty()) break;
    if (dims > 16) failure = std::string("output ") + name + " has more than 16 dims";
    if (memory_type != TRITONSERVER_MEMORY_CPU && memory_type != TRITONSERVER_MEMORY_CPU_PINNED) {
      failure = std::string("output ") + name + " is not in CPU memory";
    }
    if (!failure.empty()) break;
    const size_t name_length = std::strlen(name);
    Put(&frame, static_cast<uint16_t>(name_length));
    frame.insert(frame.end(), name, name + name_length);
    Put(&frame, static_cast<uint8_t>(datatype));
    Put(&frame, static_cast<uint8_t>(dims));
    for (uint64_t d = 0; d < dims; ++d) Put(&frame, shape[d]);
    Put(&frame, static_cast<uint64_t>(byte_size));
    const char* data = static_cast<const char*>(base);
    if (byte_size > 0) frame.insert(frame.end(), data, data + byte_size);
  }
  if (failure.empty()) *out = FrameDone(std::move(frame));
  return failure;
}

// One connection from a Python process: bytes read and not yet a whole frame (the reader's), bytes to write not
// yet taken (under the relay's lock: engine responses are queued from Triton's threads).
struct Connection {
  int fd = -1;
  std::vector<char> pending;
  std::vector<char> outgoing;
};

// One engine call of a Python process, from its request frame until Triton has completed and released it.
struct EngineCall {
  Relay* relay = nullptr;
  uint64_t serial = 0;  // the relay's key
  uint64_t id = 0;  // the Python process's number for it (the frames' stream field)
  int connection = -1;  // where its responses go; -1 once nobody reads them (connection gone, or cancelled)
  std::vector<char> frame;  // the request frame: Triton reads the inputs' data from it until it releases the request
  TRITONSERVER_InferenceRequest* request = nullptr;
  bool released = false;
  bool complete = false;  // the final response has come
  bool ended = false;  // its final frame (8 or 9) has been queued
};

class Relay {
 public:
  static TRITONSERVER_Error* Create(TRITONBACKEND_Model* model, Relay** relay);
  ~Relay();

  void Execute(TRITONBACKEND_ModelInstance* instance, TRITONBACKEND_Request** requests, uint32_t count);

 private:
  Relay() = default;
  TRITONSERVER_Error* Listen();
  void Forward(TRITONBACKEND_ModelInstance* instance, TRITONBACKEND_Request* request);
  std::string Start(Stream* stream);
  static void OnChildResponse(TRITONSERVER_InferenceResponse* response, const uint32_t flags, void* userp);
  static void OnChildReleased(TRITONSERVER_InferenceRequest* child, const uint32_t flags, void* userp);
  static void OnEngineResponse(TRITONSERVER_InferenceResponse* response, const uint32_t flags, void* userp);
  static void OnEngineReleased(TRITONSERVER_InferenceRequest* request, const uint32_t flags, void* userp);

  // With mutex_ held:
  void SendError(Stream* stream, TRITONSERVER_Error_Code code, const std::string& message);
  void SendFrame(Stream* stream, uint8_t kind, const std::vector<char>& body, size_t at);
  void End(Stream* stream);
  void ReleaseIfDone(Stream* stream, std::vector<Finished>* to_release);
  void Queue(int connection, const std::vector<char>& frame);
  void ForgetIfDone(EngineCall* call);
  void StopEngineCalls(int connection);

  // On the reader thread:
  void Read();
  bool Drain(Connection* connection);
  bool Handle(std::vector<char>& body, int connection);
  bool StartEngineCall(std::vector<char>& body, size_t at, int connection, uint64_t id);
  void TellCancelled(const Stream& stream);
  bool Flush(Connection* connection);
  void EndStreamsOf(int connection);
  void EndOrphans(uint64_t completed_by);
  // Ends every unfinished stream that `matches` with the error; how many it ended.
  size_t EndStreams(const std::function<bool(const Stream&)>& matches, TRITONSERVER_Error_Code code,
                    const std::string& message);
  void PassOnCancellations();

  TRITONSERVER_Server* server_ = nullptr;
  std::string model_name_;
  std::string python_model_;
  std::string socket_name_;  // abstract Unix socket name, without its leading NUL
  int listen_fd_ = -1;
  int wake_[2] = {-1, -1};  // a byte written to wake_[1] wakes the reader (child completed, or stopping)
  std::atomic<bool> stopping_{false};
  std::thread reader_;
  TRITONSERVER_ResponseAllocator* allocator_ = nullptr;  // the children's (they send no outputs)
  TRITONSERVER_ResponseAllocator* engine_allocator_ = nullptr;  // engine calls' outputs, on the heap

  // Guards streams_, every Stream, calls_, every EngineCall, and connections_ (whose `pending` is the reader's
  // alone); Triton's callbacks and the reader take it.
  std::recursive_mutex mutex_;
  std::vector<std::unique_ptr<Connection>> connections_;
  std::unordered_map<uint64_t, std::unique_ptr<Stream>> streams_;
  uint64_t next_stream_ = 1;
  uint64_t completions_ = 0;  // children completed so far (Stream::completion)
  std::unordered_map<uint64_t, std::unique_ptr<EngineCall>> calls_;
  uint64_t next_call_ = 1;

 public:
  // Cancels the engine calls still running and waits for Triton to be done with them (at unload: their callbacks
  // point here); false when they were not done within kUnloadWait.
  bool StopAll();
};

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

// The value of a string parameter in the model config's JSON, or "" (Triton writes it compactly:
// "parameters":{"key":{"string_value":"value"}}).
std::string ConfigParameter(const std::string& json, const std::string& key) {
  const std::string marker = "\"" + key + "\":{\"string_value\":\"";
  const size_t start = json.find(marker);
  if (start == std::string::npos) return "";
  const size_t value = start + marker.size();
  const size_t end = json.find('"', value);
  return end == std::string::npos ? "" : json.substr(value, end - value);
}

TRITONSERVER_Error* Relay::Create(TRITONBACKEND_Model* model, Relay** out) {
  std::unique_ptr<Relay> relay(new Relay());
  const char* name = nullptr;
  TRITONSERVER_Error* error = TRITONBACKEND_ModelName(model, &name);
  if (error != nullptr) return error;
  relay->model_name_ = name;
  error = TRITONBACKEND_ModelServer(model, &relay->server_);
  if (error != nullptr) return error;
  TRITONSERVER_Message* config = nullptr;
  error = TRITONBACKEND_ModelConfig(model, 1, &config);
  if (error != nullptr) return error;
  const char* json = nullptr;
  size_t json_size = 0;
  error = TRITONSERVER_MessageSerializeToJson(config, &json, &json_size);
  std::string thread_name;
  if (error == nullptr) {
    relay->python_model_ = ConfigParameter(std::string(json, json_size), "python_model_name");
    thread_name = ConfigParameter(std::string(json, json_size), "thread_name");
  }
  LogFailure(TRITONSERVER_MessageDelete(config), "model config");
  if (error != nullptr) return error;
  if (relay->python_model_.empty()) {
    return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INVALID_ARG,
                                 "llama3_relay: config.pbtxt needs the parameter python_model_name (the model whose "
                                 "responses this one sends)");
  }
  if (thread_name.empty()) thread_name = kDefaultThreadName;
  if (thread_name.size() > kMaxThreadName) {
    return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INVALID_ARG,
                                 ("llama3_relay: the parameter thread_name '" + thread_name + "' is longer than " +
                                  std::to_string(kMaxThreadName) + " characters").c_str());
  }
  error = TRITONSERVER_ResponseAllocatorNew(&relay->allocator_, RefuseAllocation, ReleaseNothing, nullptr);
  if (error != nullptr) return error;
  error = TRITONSERVER_ResponseAllocatorNew(&relay->engine_allocator_, AllocateOnHeap, FreeHeap, nullptr);
  if (error != nullptr) return error;
  error = relay->Listen();
  if (error != nullptr) return error;
  relay->reader_ = std::thread([r = relay.get()] {
    auto last_check = std::chrono::steady_clock::now();
    while (!r->stopping_) {
      r->Read();
      const auto now = std::chrono::steady_clock::now();
      if (now - last_check >= kCancellationPeriod) {
        r->PassOnCancellations();
        last_check = now;
      }
    }
  });
  pthread_setname_np(relay->reader_.native_handle(), thread_name.c_str());
  Log(TRITONSERVER_LOG_INFO, relay->model_name_ + ": sends the responses of " + relay->python_model_ +
                                 " (Python processes connect to the abstract socket @" + relay->socket_name_ + ")");
  *out = relay.release();
  return nullptr;
}

TRITONSERVER_Error* Relay::Listen() {
  // Abstract (no file to clean up), and unique per server, model and load: several servers may share a host, and a
  // reloaded model listens while the old one still finishes its streams (stream numbers restart with each).
  static std::atomic<int> loads{0};
  socket_name_ = "llama3_relay." + std::to_string(getpid()) + "." + model_name_ + "." + std::to_string(++loads);
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  if (socket_name_.size() + 1 > sizeof(address.sun_path)) {
    return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INVALID_ARG, "llama3_relay: model name too long for a socket");
  }
  std::memcpy(address.sun_path + 1, socket_name_.data(), socket_name_.size());
  const socklen_t length = offsetof(sockaddr_un, sun_path) + 1 + socket_name_.size();
  listen_fd_ = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (listen_fd_ < 0 || bind(listen_fd_, reinterpret_cast<sockaddr*>(&address), length) != 0 ||
      listen(listen_fd_, 64) != 0 || pipe2(wake_, O_NONBLOCK | O_CLOEXEC) != 0) {
    return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INTERNAL,
                                 ("llama3_relay: cannot listen on @" + socket_name_ + ": " + std::strerror(errno)).c_str());
  }
  return nullptr;
}

Relay::~Relay() {
  stopping_ = true;
  if (wake_[1] >= 0) (void)!write(wake_[1], "x", 1);
  if (reader_.joinable()) reader_.join();
  for (const auto& connection : connections_) close(connection->fd);
  for (int fd : {listen_fd_, wake_[0], wake_[1]}) {
    if (fd >= 0) close(fd);
  }
  for (TRITONSERVER_ResponseAllocator* allocator : {allocator_, engine_allocator_}) {
    if (allocator != nullptr) LogFailure(TRITONSERVER_ResponseAllocatorDelete(allocator), "allocator");
  }
  // Triton finalizes a model only when no request of it is held, so no stream is left here.
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
    std::lock_guard<std::recursive_mutex> lock(mutex_);
    stream->id = next_stream_++;
    streams_.emplace(stream->id, std::move(owned));
  }
  const std::string failure = Start(stream);
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
    SendError(stream, invalid ? TRITONSERVER_ERROR_INVALID_ARG : TRITONSERVER_ERROR_UNAVAILABLE,
              invalid ? failure.substr(8) : model_name_ + ": " + failure);
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
  const char* id = nullptr;
  failure = Failure(TRITONBACKEND_RequestId(request, &id));
  if (failure.empty() && id != nullptr && id[0] != '\0') failure = Failure(TRITONSERVER_InferenceRequestSetId(child, id));

  count = 0;
  if (failure.empty()) failure = Failure(TRITONBACKEND_RequestInputCount(request, &count));
  for (uint32_t i = 0; failure.empty() && i < count; ++i) {
    TRITONBACKEND_Input* input = nullptr;
    const char* name = nullptr;
    TRITONSERVER_DataType datatype = TRITONSERVER_TYPE_INVALID;
    const int64_t* shape = nullptr;
    uint32_t dims = 0;
    uint64_t byte_size = 0;
    uint32_t buffers = 0;
    failure = Failure(TRITONBACKEND_RequestInputByIndex(request, i, &input));
    if (failure.empty()) {
      failure = Failure(TRITONBACKEND_InputProperties(input, &name, &datatype, &shape, &dims, &byte_size, &buffers));
    }
    if (failure.empty()) failure = Failure(TRITONSERVER_InferenceRequestAddInput(child, name, datatype, shape, dims));
    for (uint32_t b = 0; failure.empty() && b < buffers; ++b) {
      const void* data = nullptr;
      uint64_t size = 0;
      TRITONSERVER_MemoryType memory_type = TRITONSERVER_MEMORY_CPU;
      int64_t memory_type_id = 0;
      failure = Failure(TRITONBACKEND_InputBuffer(input, b, &data, &size, &memory_type, &memory_type_id));
      if (failure.empty()) {
        failure = Failure(
            TRITONSERVER_InferenceRequestAppendInputData(child, name, data, size, memory_type, memory_type_id));
      }
    }
  }

  count = 0;
  if (failure.empty()) failure = Failure(TRITONBACKEND_RequestParameterCount(request, &count));
  for (uint32_t i = 0; failure.empty() && i < count; ++i) {
    const char* key = nullptr;
    TRITONSERVER_ParameterType type = TRITONSERVER_PARAMETER_STRING;
    const void* value = nullptr;
    failure = Failure(TRITONBACKEND_RequestParameter(request, i, &key, &type, &value));
    if (!failure.empty()) break;
    if (std::strcmp(key, kStreamParameter) == 0 || std::strcmp(key, kSocketParameter) == 0) {
      return std::string("INVALID:") + key + " is not an input of this model";
    }
    switch (type) {
      case TRITONSERVER_PARAMETER_STRING:
        failure = Failure(TRITONSERVER_InferenceRequestSetStringParameter(child, key, static_cast<const char*>(value)));
        break;
      case TRITONSERVER_PARAMETER_INT:
        failure = Failure(TRITONSERVER_InferenceRequestSetIntParameter(child, key, *static_cast<const int64_t*>(value)));
        break;
      case TRITONSERVER_PARAMETER_BOOL:
        failure = Failure(TRITONSERVER_InferenceRequestSetBoolParameter(child, key, *static_cast<const bool*>(value)));
        break;
      case TRITONSERVER_PARAMETER_DOUBLE:
        failure = Failure(TRITONSERVER_InferenceRequestSetDoubleParameter(child, key, *static_cast<const double*>(value)));
        break;
      default:  // no frontend makes one; refused rather than dropped
        return std::string("INVALID:") + key + ": binary request parameters are not supported";
    }
  }
  if (failure.empty()) {
    failure = Failure(TRITONSERVER_InferenceRequestSetIntParameter(child, kStreamParameter,
                                                                   static_cast<int64_t>(stream->id)));
  }
  if (failure.empty()) {
    failure = Failure(TRITONSERVER_InferenceRequestSetStringParameter(child, kSocketParameter, socket_name_.c_str()));
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
  TRITONBACKEND_Response* response = nullptr;
  TRITONSERVER_Error* error = TRITONSERVER_ErrorNew(code, message.c_str());
  std::string failure = Failure(TRITONBACKEND_ResponseNewFromFactory(&response, stream->factory));
  if (failure.empty()) failure = Failure(TRITONBACKEND_ResponseSend(response, TRITONSERVER_RESPONSE_COMPLETE_FINAL, error));
  if (!failure.empty()) {
    Log(TRITONSERVER_LOG_ERROR, "cannot send the error \"" + message + "\": " + failure);
    LogFailure(TRITONBACKEND_ResponseFactorySendFlags(stream->factory, TRITONSERVER_RESPONSE_COMPLETE_FINAL), "final");
  }
  TRITONSERVER_ErrorDelete(error);
  End(stream);
}

// A response frame's outputs from `at` on, sent on the stream's factory (final for kind 1).
void Relay::SendFrame(Stream* stream, uint8_t kind, const std::vector<char>& body, size_t at) {
  const uint32_t flags = kind == kFinalResponse ? TRITONSERVER_RESPONSE_COMPLETE_FINAL : 0;
  uint16_t outputs = 0;
  if (!Take(body, &at, &outputs)) {
    SendError(stream, TRITONSERVER_ERROR_INTERNAL, model_name_ + ": a malformed response frame");
    return;
  }
  if (outputs == 0) {
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
  FrameTensor tensor;
  for (uint16_t i = 0; failure.empty() && i < outputs; ++i) {
    if (!TakeTensor(body, &at, &tensor)) {
      failure = "a malformed response frame";
      break;
    }
    if (stream->requested.count(tensor.name) == 0) continue;
    TRITONBACKEND_Output* output = nullptr;
    void* buffer = nullptr;
    TRITONSERVER_MemoryType memory_type = TRITONSERVER_MEMORY_CPU;
    int64_t memory_type_id = 0;
    failure = Failure(TRITONBACKEND_ResponseOutput(response, &output, tensor.name.c_str(),
                                                   static_cast<TRITONSERVER_DataType>(tensor.datatype), tensor.shape,
                                                   tensor.dims));
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
  const uint32_t send_flags = error != nullptr ? TRITONSERVER_RESPONSE_COMPLETE_FINAL : flags;
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

// One wait for the sockets (at most kCancellationPeriod), then everything that can be read, and written.
void Relay::Read() {
  std::vector<pollfd> fds;
  fds.push_back({wake_[0], POLLIN, 0});
  fds.push_back({listen_fd_, POLLIN, 0});
  {
    std::lock_guard<std::recursive_mutex> lock(mutex_);
    for (const auto& connection : connections_) {
      fds.push_back({connection->fd, static_cast<short>(POLLIN | (connection->outgoing.empty() ? 0 : POLLOUT)), 0});
    }
  }
  const int ready = poll(fds.data(), fds.size(), static_cast<int>(kCancellationPeriod.count()));
  if (ready <= 0) return;
  bool woken = false;
  if ((fds[0].revents & POLLIN) != 0) {
    char drained[64];
    while (read(wake_[0], drained, sizeof(drained)) > 0) {
    }
    woken = true;
  }
  // The children completed by now wrote their final frames before they completed: the reads below find them. One
  // that completes while they read may have written after its connection was read: the next pass (its wake-up)
  // looks for its frame, so this pass must not call it an orphan.
  uint64_t completed_by;
  {
    std::lock_guard<std::recursive_mutex> lock(mutex_);
    completed_by = completions_;
  }
  if ((fds[1].revents & POLLIN) != 0 || woken) {  // woken: a connection may have come after the poll looked
    int fd;
    while ((fd = accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC)) >= 0) {
      std::lock_guard<std::recursive_mutex> lock(mutex_);
      connections_.push_back(std::make_unique<Connection>());
      connections_.back()->fd = fd;
    }
  }
  // Every connection is read to its end when woken: a completed child's final frame is in one of them, also in a
  // connection accepted just now (a process's first: its claim, frames and final frame may all be there already).
  // Only the reader adds or removes connections, so the ones polled are connections_[0, polled) still, and the
  // ones accepted since follow them.
  const size_t polled = fds.size() - 2;
  size_t count;
  {
    std::lock_guard<std::recursive_mutex> lock(mutex_);
    count = connections_.size();
  }
  std::vector<Connection*> broken;
  for (size_t i = 0; i < count; ++i) {
    Connection* connection;
    {
      std::lock_guard<std::recursive_mutex> lock(mutex_);
      connection = connections_[i].get();
    }
    const bool readable = i >= polled || fds[i + 2].revents != 0;
    bool open = !(readable || woken) || Drain(connection);
    if (open) {
      std::lock_guard<std::recursive_mutex> lock(mutex_);
      open = Flush(connection);
    }
    if (!open) broken.push_back(connection);
  }
  for (Connection* connection : broken) {
    const int fd = connection->fd;
    EndStreamsOf(fd);
    StopEngineCalls(fd);
    std::lock_guard<std::recursive_mutex> lock(mutex_);
    for (auto at = connections_.begin(); at != connections_.end(); ++at) {
      if (at->get() == connection) {
        connections_.erase(at);
        break;
      }
    }
    close(fd);
  }
  if (woken) EndOrphans(completed_by);
}

// Reads what the connection has and handles its whole frames; false when it is closed or broken.
bool Relay::Drain(Connection* connection) {
  char chunk[65536];
  while (true) {
    const ssize_t got = read(connection->fd, chunk, sizeof(chunk));
    if (got == 0) return false;  // the Python process closed it (unloaded or died: Triton fails its children)
    if (got < 0) {
      if (errno == EINTR) continue;
      return errno == EAGAIN || errno == EWOULDBLOCK;
    }
    connection->pending.insert(connection->pending.end(), chunk, chunk + got);
    size_t at = 0;
    std::vector<char> body;
    while (connection->pending.size() - at >= 4) {
      uint32_t length = 0;
      std::memcpy(&length, connection->pending.data() + at, 4);
      if (length > kMaxFrameBytes) {
        Log(TRITONSERVER_LOG_ERROR, "a frame of " + std::to_string(length) + " bytes: closing the connection");
        return false;
      }
      if (connection->pending.size() - at - 4 < length) break;
      body.assign(connection->pending.begin() + at + 4, connection->pending.begin() + at + 4 + length);
      at += 4 + length;
      if (!Handle(body, connection->fd)) {
        Log(TRITONSERVER_LOG_ERROR, "a malformed frame: closing the connection");
        return false;
      }
    }
    connection->pending.erase(connection->pending.begin(), connection->pending.begin() + at);
  }
}

bool Relay::Handle(std::vector<char>& body, int connection) {
  size_t at = 0;
  uint64_t id = 0;
  uint8_t kind = 0;
  if (!Take(body, &at, &id) || !Take(body, &at, &kind)) return false;
  if (kind == kEngineRequest) return StartEngineCall(body, at, connection, id);
  if (kind == kEngineCancel) {
    std::lock_guard<std::recursive_mutex> lock(mutex_);
    for (auto& entry : calls_) {
      EngineCall* call = entry.second.get();
      if (call->connection != connection || call->id != id) continue;
      call->connection = -1;  // the Python process has stopped reading it
      if (!call->complete) LogFailure(TRITONSERVER_InferenceRequestCancel(call->request), "cancelling an engine call");
      break;
    }
    return true;
  }
  if (kind > kClaim) return false;
  std::vector<Finished> to_release;
  {
    std::lock_guard<std::recursive_mutex> lock(mutex_);
    auto found = streams_.find(id);
    if (found == streams_.end() || found->second->factory == nullptr) return true;  // ended (client error, failure)
    Stream* stream = found->second.get();
    stream->connection = connection;
    if (kind == kClaim) {
      if (stream->cancel_passed_on) TellCancelled(*stream);  // cancelled before its process claimed it
      return true;
    }
    if (kind == kError) {
      uint32_t code = 0;
      if (!Take(body, &at, &code)) return false;
      SendError(stream, static_cast<TRITONSERVER_Error_Code>(code), std::string(body.data() + at, body.size() - at));
    } else {
      SendFrame(stream, kind, body, at);
    }
    ReleaseIfDone(stream, &to_release);
  }
  ReleaseAll(to_release);
  return true;
}

// An engine request frame becomes an in-process request to the engine; its responses go back on `connection`.
// False when the frame is malformed.
bool Relay::StartEngineCall(std::vector<char>& body, size_t at, int connection, uint64_t id) {
  std::string model, request_id;
  uint16_t outputs = 0;
  uint16_t inputs = 0;
  std::vector<std::string> requested;
  bool whole = TakeString(body, &at, &model) && TakeString(body, &at, &request_id) && Take(body, &at, &outputs);
  for (uint16_t i = 0; whole && i < outputs; ++i) {
    requested.emplace_back();
    whole = TakeString(body, &at, &requested.back());
  }
  whole = whole && Take(body, &at, &inputs);
  std::vector<FrameTensor> tensors(whole ? inputs : 0);
  for (FrameTensor& tensor : tensors) whole = whole && TakeTensor(body, &at, &tensor);
  if (!whole) return false;

  auto owned = std::make_unique<EngineCall>();
  EngineCall* call = owned.get();
  call->relay = this;
  call->id = id;
  call->connection = connection;
  call->frame.swap(body);  // the inputs' data stays where it is, owned by the call
  const char* data = call->frame.data();
  TRITONSERVER_Error* error = TRITONSERVER_InferenceRequestNew(&call->request, server_, model.c_str(), -1);
  if (error == nullptr && !request_id.empty()) error = TRITONSERVER_InferenceRequestSetId(call->request, request_id.c_str());
  for (const FrameTensor& tensor : tensors) {
    if (error == nullptr) {
      error = TRITONSERVER_InferenceRequestAddInput(call->request, tensor.name.c_str(),
                                                    static_cast<TRITONSERVER_DataType>(tensor.datatype), tensor.shape,
                                                    tensor.dims);
    }
    if (error == nullptr) {
      error = TRITONSERVER_InferenceRequestAppendInputData(call->request, tensor.name.c_str(), data + tensor.data,
                                                           tensor.length, TRITONSERVER_MEMORY_CPU, 0);
    }
  }
  for (const std::string& name : requested) {
    if (error == nullptr) error = TRITONSERVER_InferenceRequestAddRequestedOutput(call->request, name.c_str());
  }
  if (error == nullptr) error = TRITONSERVER_InferenceRequestSetReleaseCallback(call->request, OnEngineReleased, call);
  if (error == nullptr) {
    error = TRITONSERVER_InferenceRequestSetResponseCallback(call->request, engine_allocator_, nullptr,
                                                             OnEngineResponse, call);
  }
  std::lock_guard<std::recursive_mutex> lock(mutex_);  // held through InferAsync: callbacks wait for the call's entry
  call->serial = next_call_++;
  if (error == nullptr) {
    calls_.emplace(call->serial, std::move(owned));
    error = TRITONSERVER_ServerInferAsync(server_, call->request, nullptr);
    if (error == nullptr) return true;
    owned = std::move(calls_[call->serial]);  // Triton did not take it: ours to delete
    calls_.erase(call->serial);
  }
  Queue(connection, ErrorFrame(id, kEngineError, TRITONSERVER_ErrorCode(error),
                               model + ": " + TRITONSERVER_ErrorMessage(error)));
  TRITONSERVER_ErrorDelete(error);
  if (call->request != nullptr) LogFailure(TRITONSERVER_InferenceRequestDelete(call->request), "engine request");
  return true;
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
    const std::string failure = TensorFrame(call->id, final ? kEngineFinal : kEngineResponse, response, &frame);
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

// With the lock held.
void Relay::ForgetIfDone(EngineCall* call) {
  if (!call->released || !call->complete) return;
  LogFailure(TRITONSERVER_InferenceRequestDelete(call->request), "engine request");
  calls_.erase(call->serial);
}

// The connection is gone: its engine calls are cancelled (nobody reads them). With or without the lock.
void Relay::StopEngineCalls(int connection) {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  for (auto& entry : calls_) {
    EngineCall* call = entry.second.get();
    if (call->connection != connection) continue;
    call->connection = -1;
    if (!call->complete) LogFailure(TRITONSERVER_InferenceRequestCancel(call->request), "cancelling an engine call");
  }
}

bool Relay::StopAll() {
  StopEngineCalls(-1);  // those already cancelled by Python
  {
    std::lock_guard<std::recursive_mutex> lock(mutex_);
    for (const auto& connection : connections_) StopEngineCalls(connection->fd);
  }
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

// Queues a frame for a connection and writes what it can at once (with the lock held); dropped when the connection
// is gone (-1 or closed). What the socket cannot take now the reader writes when it can.
void Relay::Queue(int fd, const std::vector<char>& frame) {
  for (const auto& connection : connections_) {
    if (connection->fd != fd) continue;
    const bool was_empty = connection->outgoing.empty();
    connection->outgoing.insert(connection->outgoing.end(), frame.begin(), frame.end());
    if (was_empty && Flush(connection.get()) && !connection->outgoing.empty()) {
      (void)!write(wake_[1], "w", 1);  // the reader then polls for the socket to take more
    }
    return;
  }
}

// A Python process's connection ended (it exited, or a frame was cut): the streams it was sending end now with
// an error, rather than waiting for a child that Triton may never complete (a dead stub's requests get no response
// in Triton 2.51). Streams that had no frame yet end when their child does.
void Relay::EndStreamsOf(int connection) {
  const size_t ended = EndStreams([connection](const Stream& stream) { return stream.connection == connection; },
                                  TRITONSERVER_ERROR_UNAVAILABLE,
                                  model_name_ + ": " + python_model_ +
                                      "'s process stopped sending this stream (it ended or failed)");
  if (ended > 0) {
    Log(TRITONSERVER_LOG_ERROR, "the connection from " + python_model_ + " ended with " + std::to_string(ended) +
                                    " streams unfinished; they ended with an error");
  }
}

// Streams whose child completed without a final frame, now that every frame written before it was read.
void Relay::EndOrphans(uint64_t completed_by) {
  EndStreams([completed_by](const Stream& stream) { return stream.child_complete && stream.completion <= completed_by; },
             TRITONSERVER_ERROR_INTERNAL,
             model_name_ + ": " + python_model_ + " completed the request without a final response");
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
      if (stream->connection >= 0) TellCancelled(*stream);  // else when its process claims it
    }
  }
}

// Tells the stream's process that its client cancelled it (with the lock held).
void Relay::TellCancelled(const Stream& stream) { Queue(stream.connection, FrameDone(FrameStart(stream.id, kCancelled))); }

// Writes what the connection can take of its outgoing bytes (with the lock held); false when it is broken.
bool Relay::Flush(Connection* connection) {
  while (!connection->outgoing.empty()) {
    const ssize_t sent = send(connection->fd, connection->outgoing.data(), connection->outgoing.size(),
                              MSG_NOSIGNAL | MSG_DONTWAIT);
    if (sent < 0) {
      if (errno == EINTR) continue;
      return errno == EAGAIN || errno == EWOULDBLOCK;  // the rest when poll says it can take more
    }
    connection->outgoing.erase(connection->outgoing.begin(), connection->outgoing.begin() + sent);
  }
  return true;
}

}  // namespace

extern "C" {

TRITONSERVER_Error* TRITONBACKEND_ModelInitialize(TRITONBACKEND_Model* model) {
  Relay* relay = nullptr;
  TRITONSERVER_Error* error = Relay::Create(model, &relay);
  if (error != nullptr) return error;
  return TRITONBACKEND_ModelSetState(model, relay);
}

TRITONSERVER_Error* TRITONBACKEND_ModelFinalize(TRITONBACKEND_Model* model) {
  void* state = nullptr;
  TRITONSERVER_Error* error = TRITONBACKEND_ModelState(model, &state);
  Relay* relay = static_cast<Relay*>(state);
  if (relay != nullptr && !relay->StopAll()) {
    // Triton may still call back into it: leaked rather than freed under those callbacks.
    Log(TRITONSERVER_LOG_ERROR, "engine calls still running at unload after 30 s; the relay's memory is left allocated");
    return error;
  }
  delete relay;
  return error;
}

TRITONSERVER_Error* TRITONBACKEND_ModelInstanceExecute(TRITONBACKEND_ModelInstance* instance,
                                                       TRITONBACKEND_Request** requests, const uint32_t count) {
  TRITONBACKEND_Model* model = nullptr;
  void* state = nullptr;
  TRITONSERVER_Error* error = TRITONBACKEND_ModelInstanceModel(instance, &model);
  if (error == nullptr) error = TRITONBACKEND_ModelState(model, &state);
  if (error != nullptr) return error;  // Triton then fails every request with it
  static_cast<Relay*>(state)->Execute(instance, requests, count);
  return nullptr;
}

}  // extern "C"
