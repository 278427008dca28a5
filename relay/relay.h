// llama3_relay: a Triton backend (C++) that fronts a Python-backend model and sends its responses for it.
//
// Why: a Python-backend model pays for every response it sends a synchronous round trip between its stub
// process and tritonserver (python_backend's ResponseSender::Send), in both processes. TensorRT-LLM's C++
// backend sends one response per generated token per stream, so that cost, not the GPU, set the BLS's CPU per
// token (docs/benchmarks.md has the measurements). Here the Python model keeps
// every decision (inputs, tokenization, streaming text, finish reasons, errors) and hands each response to
// this backend as a frame on a Unix socket, many frames to a write; this backend turns the frames into Triton
// responses from inside tritonserver.
//
// How a request goes:
// 1. The client's request (decoupled) arrives here. It is forwarded, inputs (by reference, no copy), request
//    id and parameters, as a child request to the Python model (config parameter `python_model_name`), with
//    three parameters of ours: kStreamParameter (this request's number), kSocketParameter (the socket's path)
//    and kTokenParameter (the stream's token, token.h: unguessable without the relay's key).
// 2. The Python model claims the stream on its connection, presenting the token, then writes the request's
//    responses as frames on it, the last one final (a final response or an error), and only then completes its
//    child request with an empty final response. Every Python process has its own connection.
// 3. Each frame becomes a response on the client's request; outputs the client did not ask for are dropped,
//    as the Python backend drops them.
// 4. A child that fails in Triton (model unloaded, stub died, queue full) ends the client's stream with its
//    error. A child that completes without a final frame (a bug) ends it with an internal error, never a hang.
// 5. The client's cancellation (checked every kCancellationPeriod) is passed on to the child request, and told
//    to the connection that claimed the stream (a "cancelled" frame), which stops its engine request: the Python
//    model never asks Triton (request.is_cancelled(), a round trip each).
// 6. Engine calls: the Python model's own requests to the engines the config names (`engine_models`) go through
//    the relay on the same connection: each is sent in-process (TRITONSERVER_ServerInferAsync) and every engine
//    response is written back as a frame, as it comes.
// 7. When tritonserver begins to stop, every stream ends at once with kShutdownMessage, its child is cancelled (its
//    process told, as for a client's cancellation) and every engine call is cancelled (ServerExiting says why the
//    relay must notice the stop itself).
//
// Who may talk to it (the relay runs inside tritonserver and can start inferences on its models, so the socket
// is a way into the server): both of
// - a filesystem socket in a directory of its own created 0700 (mkdtemp under $XDG_RUNTIME_DIR, $TMPDIR or
//   /tmp; removed at unload): only the server's user can reach it. An abstract socket would not do: it belongs
//   to the network namespace, which `docker run --net host` shares with every process of every user on the host.
// - SO_PEERCRED checked on accept: a peer of another uid is closed at once and logged. The directory's mode is
//   the gate; the check keeps it shut if the directory's protection is ever lost (a TMPDIR on a filesystem that
//   ignores modes) and names who tried.
// And per stream: a connection may send frames only for the streams it claimed with their tokens, and engine
// calls only to the configured engines. Anything malformed or hostile closes that connection (its streams end
// with an error, its engine calls are cancelled); nothing a peer sends can stop the relay's thread or the server.
//
// The same library serves a second kind of model, the ensemble's handoff (handoff.h): no socket, no Python model;
// it forwards the ensemble's engine requests and re-sends the engine's responses from threads of its own. A model's
// config says which it is (backend.cc).
//
// The code, by responsibility: frames.{h,cc} (the layout, relay/frames.md), streams.cc (client requests and
// their children), child_request.cc (a received request copied onto a new one), engine_calls.cc, socket_loop.cc
// (the socket, its peers, the reader thread), handoff.{h,cc} (merge.{h,cc}: a stream's waiting responses as one),
// backend.cc (Triton's entry points and the model's config).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "frames.h"
#include "triton/core/tritonbackend.h"
#include "triton/core/tritonserver.h"

namespace llama3_relay {

constexpr const char* kStreamParameter = "llama3_relay_stream";
constexpr const char* kSocketParameter = "llama3_relay_socket";
constexpr const char* kTokenParameter = "llama3_relay_token";
constexpr auto kCancellationPeriod = std::chrono::milliseconds(100);
constexpr auto kUnloadWait = std::chrono::seconds(30);  // for engine calls still running when the model unloads
// Bytes queued for a connection that does not read them: past this it is closed (a Python reader never lags so far).
constexpr size_t kMaxOutgoingBytes = size_t{1} << 30;
// Reads of one connection per pass of the reader (64 KiB each): a peer that never stops writing cannot keep the
// reader from the others.
constexpr int kReadsPerPass = 64;
// Python processes connect once each (one per instance of each relayed model): more is a peer opening connections.
constexpr size_t kMaxConnections = 1024;

// What a stream still running gets when tritonserver begins to shut down: the relay and the handoff end every stream
// at once, with this error, and stop the engine requests behind them, so that a stop ends within seconds (however
// long the streams would have run) and every client reads why its stream ended. Triton itself waits for them
// (its Stop waits, up to --exit-timeout-secs, for the models to unload, and a model unloads once its requests are
// released) and has no way to tell a model that it stops (docs/operations.md, "Stopping the server").
constexpr const char* kShutdownMessage = "tritonserver is shutting down; retry on another server";
// Whether tritonserver has begun to shut down (SIGINT or SIGTERM): TRITONSERVER_ServerIsLive answers UNAVAILABLE
// "Server exiting" from then on (core's InferenceServer::IsLive, src/server.cc, r24.10 to r26.06, the core of
// Triton 26.07). A cheap call: an atomic read.
bool ServerExiting(TRITONSERVER_Server* server);

void Log(TRITONSERVER_LogLevel level, const std::string& message);
// A failed call's message (the error released), or "" when it succeeded.
std::string Failure(TRITONSERVER_Error* error);
// For calls whose failure ends nothing more than itself.
void LogFailure(TRITONSERVER_Error* error, const char* what);
uint64_t NowNs();  // the clock of Triton's own statistics
// The value of a string parameter in a model config's JSON, or "" (backend.cc).
std::string ConfigParameter(const std::string& json, const std::string& key);
TRITONSERVER_Error* InvalidConfig(const std::string& message);  // the model cannot load: the config's fault
// The final response of `factory`, carrying the error; the final flag alone when even that cannot be sent (logged).
void SendFinalError(TRITONBACKEND_ResponseFactory* factory, TRITONSERVER_Error_Code code, const std::string& message);
// One output of an in-process response (TRITONSERVER_InferenceResponseOutput's fields).
struct ResponseOutput {
  const char* name = nullptr;
  TRITONSERVER_DataType datatype = TRITONSERVER_TYPE_INVALID;
  const int64_t* shape = nullptr;
  uint64_t dims = 0;
  const void* base = nullptr;
  size_t byte_size = 0;
  TRITONSERVER_MemoryType memory_type = TRITONSERVER_MEMORY_CPU;
  int64_t memory_type_id = 0;
};
// Output `index` of `response`; "" or why it could not be read.
std::string ReadOutput(TRITONSERVER_InferenceResponse* response, uint32_t index, ResponseOutput* output);
TRITONSERVER_Error* NewChildAllocator(TRITONSERVER_ResponseAllocator** allocator);  // streams.cc
TRITONSERVER_Error* NewEngineAllocator(TRITONSERVER_ResponseAllocator** allocator);  // engine_calls.cc
// child_request.cc: `from`'s id, inputs (by reference) and request parameters onto `to`; "" when done, else why not
// ("INVALID:" + the message when the client named one of `reserved_parameters` or sent a binary parameter).
std::string CopyRequest(TRITONBACKEND_Request* from, TRITONSERVER_InferenceRequest* to,
                        const std::vector<const char*>& reserved_parameters);

class Relay;

// One client request, from its arrival to its final response and the release of its child.
struct Stream {
  Relay* relay = nullptr;
  TRITONBACKEND_ModelInstance* instance = nullptr;  // reports the request's statistics
  uint64_t id = 0;
  std::string token;  // StreamToken(key_, id): the claim must present it
  uint64_t arrived_ns = 0;
  bool failed = false;  // ended with an error (Triton's success/failure counts)
  TRITONBACKEND_Request* request = nullptr;  // the client's: its inputs back the child's; released with it
  TRITONBACKEND_ResponseFactory* factory = nullptr;  // null once the final response has gone
  // Ours again once Triton has released it (the Python backend does when its execute returns), but kept until
  // the child completes: cancelling it then still reaches the Python model, whose response factory it shares.
  TRITONSERVER_InferenceRequest* child = nullptr;
  bool child_released = false;
  bool child_started = false;  // handed to Triton (only then can it be cancelled)
  std::unordered_set<std::string> requested;  // outputs the client asked for (Triton lists all if none)
  bool child_complete = false;  // the child's final response (or error) has come
  uint64_t completion = 0;  // when it came, in Relay::completions_ (which orphans a reader pass may end)
  bool cancel_passed_on = false;
  uint64_t connection = 0;  // the connection that claimed it (Connection::serial; 0: none yet)
};

// A client request whose child is done: its statistics go to Triton, then the request is released.
struct Finished {
  TRITONBACKEND_ModelInstance* instance;
  TRITONBACKEND_Request* request;
  bool success;
  uint64_t arrived_ns;
};

// Called without the relay's lock, as the last thing a callback does: once the last request is released the model
// may unload.
void ReleaseAll(const std::vector<Finished>& finished);

// One connection from a Python process. `incoming` is the reader's alone; `outgoing` (bytes to write not yet
// taken) and `failed` are under the relay's lock: engine responses are queued from Triton's threads.
struct Connection {
  uint64_t serial = 0;  // never reused, unlike file descriptors
  int fd = -1;
  int pid = 0;  // the peer's, for the log
  FrameSplitter incoming;
  std::vector<char> outgoing;
  std::string failed;  // why it must be closed, when a thread other than the reader found out
};

// One engine call of a Python process, from its request frame until Triton has completed and released it.
struct EngineCall {
  Relay* relay = nullptr;
  uint64_t serial = 0;  // the relay's key
  uint64_t id = 0;  // the Python process's number for it (the frames' stream field)
  uint64_t connection = 0;  // where its responses go; 0 once nobody reads them (connection gone, or cancelled)
  std::vector<char> body;  // the request frame: Triton reads the inputs' data from it until it releases the request
  TRITONSERVER_InferenceRequest* request = nullptr;
  bool released = false;
  bool complete = false;  // the final response has come
  bool ended = false;  // its final frame (8 or 9) has been queued
};

// What a model of this backend is, chosen by its config (backend.cc): the relay in front of a Python model, or the
// ensemble's handoff (handoff.h).
class ModelRole {
 public:
  virtual ~ModelRole() = default;
  virtual void Execute(TRITONBACKEND_ModelInstance* instance, TRITONBACKEND_Request** requests, uint32_t count) = 0;
  // At unload: waits for Triton to be done with what the model started (its callbacks point into it); false when
  // that did not happen within kUnloadWait.
  virtual bool StopAll() = 0;
};

class Relay : public ModelRole {
 public:
  // The model's relay, listening (backend.cc reads the config).
  static TRITONSERVER_Error* Create(TRITONBACKEND_Model* model, const std::string& config_json, Relay** relay);
  ~Relay() override;

  void Execute(TRITONBACKEND_ModelInstance* instance, TRITONBACKEND_Request** requests, uint32_t count) override;
  // Also cancels the engine calls still running.
  bool StopAll() override;

 private:
  Relay() = default;

  // socket_loop.cc
  TRITONSERVER_Error* Listen();
  void StartReader(const std::string& thread_name);
  void Read();
  void Accept();
  // Reads and handles what the connection has, up to kReadsPerPass reads (`*all` false when more is waiting); ""
  // while it is open and well-behaved, else why it is closed.
  std::string Drain(Connection* connection, bool* all);
  std::string Handle(std::vector<char>& body, Connection* connection);
  void Close(Connection* connection, const std::string& why);
  void Queue(uint64_t connection, const std::vector<char>& frame);  // with mutex_ held
  std::string Flush(Connection* connection);  // with mutex_ held
  void EndOrphans(uint64_t completed_by);

  // streams.cc
  void Forward(TRITONBACKEND_ModelInstance* instance, TRITONBACKEND_Request* request);
  std::string Start(Stream* stream);
  std::string HandleStreamFrame(const Frame& frame, const std::vector<char>& body, Connection* connection);
  static void OnChildResponse(TRITONSERVER_InferenceResponse* response, const uint32_t flags, void* userp);
  static void OnChildReleased(TRITONSERVER_InferenceRequest* child, const uint32_t flags, void* userp);
  void PassOnCancellations();
  // tritonserver is shutting down: every stream ends now with kShutdownMessage, its child is cancelled (and its
  // process told), and every engine call is cancelled. On the reader thread, once.
  void EndForShutdown();
  // Ends every unfinished stream that `matches` with the error; how many it ended.
  size_t EndStreams(const std::function<bool(const Stream&)>& matches, TRITONSERVER_Error_Code code,
                    const std::string& message);
  // With mutex_ held:
  void SendError(Stream* stream, TRITONSERVER_Error_Code code, const std::string& message);
  void SendFrame(Stream* stream, const Frame& frame, const std::vector<char>& body);
  void End(Stream* stream);
  void ReleaseIfDone(Stream* stream, std::vector<Finished>* to_release);
  void TellCancelled(const Stream& stream);

  // engine_calls.cc
  std::string StartEngineCall(const Frame& frame, std::vector<char>& body, Connection* connection);
  void CancelEngineCall(uint64_t id, uint64_t connection);
  static void OnEngineResponse(TRITONSERVER_InferenceResponse* response, const uint32_t flags, void* userp);
  static void OnEngineReleased(TRITONSERVER_InferenceRequest* request, const uint32_t flags, void* userp);
  void ForgetIfDone(EngineCall* call);  // with mutex_ held
  void StopEngineCalls(uint64_t connection);
  void CancelEngineCalls();  // every one, whoever started it (unload, shutdown)

  TRITONSERVER_Server* server_ = nullptr;
  std::string model_name_;
  std::string python_model_;
  std::unordered_set<std::string> engine_models_;  // the models engine calls may name (config `engine_models`)
  std::string directory_;  // the private directory (0700) holding the socket and the key
  std::string key_;  // kKeyBytes random bytes: the streams' tokens (token.h)
  std::string socket_path_;
  int listen_fd_ = -1;
  int wake_[2] = {-1, -1};  // a byte written to wake_[1] wakes the reader (child completed, or stopping)
  std::atomic<bool> stopping_{false};
  std::atomic<bool> exiting_{false};  // the server is shutting down: streams ended, new ones refused
  std::thread reader_;
  TRITONSERVER_ResponseAllocator* allocator_ = nullptr;  // the children's (they send no outputs)
  TRITONSERVER_ResponseAllocator* engine_allocator_ = nullptr;  // engine calls' outputs, on the heap

  // Guards streams_, every Stream, calls_, every EngineCall, and connections_ (but not a Connection's `incoming`,
  // the reader's alone); Triton's callbacks and the reader take it.
  std::recursive_mutex mutex_;
  std::vector<std::unique_ptr<Connection>> connections_;
  uint64_t next_connection_ = 1;
  std::unordered_map<uint64_t, std::unique_ptr<Stream>> streams_;
  uint64_t next_stream_ = 1;
  uint64_t completions_ = 0;  // children completed so far (Stream::completion)
  std::unordered_map<uint64_t, std::unique_ptr<EngineCall>> calls_;
  uint64_t next_call_ = 1;
};

}  // namespace llama3_relay
