// Triton's entry points (TRITONBACKEND_*), the model's config, and what every part of the relay shares.
#include <signal.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>

#include "handoff.h"
#include "relay.h"

namespace llama3_relay {
namespace {

// The reader thread's name unless the config's `thread_name` parameter gives another: the bench's CPU accounting
// tells relays apart by it (testkit/processes.py), e.g. the BLS's from the one in front of the benchmark engine.
constexpr const char* kDefaultThreadName = "llama3_relay";
constexpr size_t kMaxThreadName = 15;  // Linux's limit, without the NUL

}  // namespace

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

namespace {

// "a, b" -> {a, b}; empty items dropped.
std::unordered_set<std::string> NameList(const std::string& text) {
  std::unordered_set<std::string> names;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find(',', start);
    if (end == std::string::npos) end = text.size();
    std::string name = text.substr(start, end - start);
    name.erase(0, name.find_first_not_of(' '));
    name.erase(name.find_last_not_of(' ') + 1);
    if (!name.empty()) names.insert(name);
    start = end + 1;
  }
  return names;
}

}  // namespace

TRITONSERVER_Error* InvalidConfig(const std::string& message) {
  return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INVALID_ARG, ("llama3_relay: " + message).c_str());
}

void SendFinalError(TRITONBACKEND_ResponseFactory* factory, TRITONSERVER_Error_Code code, const std::string& message) {
  TRITONBACKEND_Response* response = nullptr;
  TRITONSERVER_Error* error = TRITONSERVER_ErrorNew(code, message.c_str());
  std::string failure = Failure(TRITONBACKEND_ResponseNewFromFactory(&response, factory));
  if (failure.empty()) failure = Failure(TRITONBACKEND_ResponseSend(response, TRITONSERVER_RESPONSE_COMPLETE_FINAL, error));
  if (!failure.empty()) {
    Log(TRITONSERVER_LOG_ERROR, "cannot send the error \"" + message + "\": " + failure);
    LogFailure(TRITONBACKEND_ResponseFactorySendFlags(factory, TRITONSERVER_RESPONSE_COMPLETE_FINAL), "final");
  }
  TRITONSERVER_ErrorDelete(error);
}

std::string ReadOutput(TRITONSERVER_InferenceResponse* response, uint32_t index, ResponseOutput* output) {
  void* userp = nullptr;
  return Failure(TRITONSERVER_InferenceResponseOutput(response, index, &output->name, &output->datatype, &output->shape,
                                                      &output->dims, &output->base, &output->byte_size,
                                                      &output->memory_type, &output->memory_type_id, &userp));
}

// Why the server's stop signal is watched, and not only its state: tritonserver's main (server src/main.cc, r24.10
// and r26.07) answers SIGINT/SIGTERM by first draining its frontends, HTTP (waiting for every open connection to
// close) and in 26.07 gRPC too (waiting for every call to end), each for up to --exit-timeout-secs, and only then
// calls TRITONSERVER_ServerStop, from which on the core says it is exiting. A stream still running keeps its
// connection open: it would run on through the whole drain, which then leaves the core no time to unload the models
// (exit status 1). So the relay learns of the signal itself: once Triton has installed its handlers (with signal(),
// right after TRITONSERVER_ServerNew loaded the models: src/triton_signal.cc RegisterSignalHandler), a handler of
// ours is put in front of each; it notes the signal and calls Triton's. Finalize puts Triton's back before the
// library can be unloaded. The chain is made at the first check after Triton's handlers are there (the relay's and
// the handoff's checks run every kCancellationPeriod): a signal in between (a stop within ~100 ms of the server's
// start) is Triton's alone, and this copy learns of the stop only from TRITONSERVER_ServerIsLive, after the drain.
// The log says when each copy watches ("watching tritonserver's stop signals").
namespace {

constexpr int kStopSignals[] = {SIGINT, SIGTERM};
std::atomic<bool> stop_signal_seen{false};  // lock-free: set in the signal handler
std::mutex chain_mutex;  // guards chained and previous (never taken in the handler)
bool chained = false;
struct sigaction previous[2];  // Triton's handlers, by kStopSignals' index

void OnStopSignal(int signum) {
  stop_signal_seen.store(true);
  const struct sigaction& triton = previous[signum == SIGINT ? 0 : 1];
  if ((triton.sa_flags & SA_SIGINFO) == 0 && triton.sa_handler != SIG_DFL && triton.sa_handler != SIG_IGN) {
    triton.sa_handler(signum);
  }
}

// Puts OnStopSignal in front of Triton's handlers once they are there (a handler for both signals); false until then.
bool ChainStopSignals() {
  std::lock_guard<std::mutex> lock(chain_mutex);
  if (chained) return true;
  struct sigaction current[2];
  for (int i = 0; i < 2; ++i) {
    if (sigaction(kStopSignals[i], nullptr, &current[i]) != 0) return false;
    const bool handled = (current[i].sa_flags & SA_SIGINFO) == 0 && current[i].sa_handler != SIG_DFL &&
                         current[i].sa_handler != SIG_IGN;
    if (!handled) return false;  // the models load before Triton installs its handlers
  }
  struct sigaction ours {};
  ours.sa_handler = OnStopSignal;
  sigemptyset(&ours.sa_mask);
  for (int i = 0; i < 2; ++i) {
    // Installed and the handler it replaces read in one sigaction call: the relay and the handoff are two copies of
    // this library (each model's own), each with its own chain_mutex, and a read followed by a separate write let
    // the second copy overwrite the first's handler when both chained at once (the first then never saw the signal).
    // previous[i] holds what was read above until the call returns what it replaced, so that a signal arriving in
    // between still reaches Triton.
    previous[i] = current[i];
    ours.sa_flags = current[i].sa_flags;
    struct sigaction replaced {};
    if (sigaction(kStopSignals[i], &ours, &replaced) != 0) {
      Log(TRITONSERVER_LOG_ERROR, std::string("cannot watch the server's stop signals: ") + std::strerror(errno));
      for (int j = 0; j < i; ++j) sigaction(kStopSignals[j], &previous[j], nullptr);
      return false;
    }
    previous[i] = replaced;
  }
  chained = true;
  Log(TRITONSERVER_LOG_INFO, "watching tritonserver's stop signals (SIGINT, SIGTERM)");
  return true;
}

// Triton's own handlers back (TRITONBACKEND_Finalize: the library may be unloaded next), where ours still are.
void UnchainStopSignals() {
  std::lock_guard<std::mutex> lock(chain_mutex);
  if (!chained) return;
  for (int i = 0; i < 2; ++i) {
    struct sigaction current {};
    if (sigaction(kStopSignals[i], nullptr, &current) == 0 && current.sa_handler == OnStopSignal) {
      sigaction(kStopSignals[i], &previous[i], nullptr);
    }
  }
  chained = false;
}

}  // namespace

bool ServerExiting(TRITONSERVER_Server* server) {
  if (stop_signal_seen.load()) return true;
  ChainStopSignals();
  bool live = false;
  TRITONSERVER_Error* error = TRITONSERVER_ServerIsLive(server, &live);
  if (error == nullptr) return false;
  const bool exiting = TRITONSERVER_ErrorCode(error) == TRITONSERVER_ERROR_UNAVAILABLE;
  TRITONSERVER_ErrorDelete(error);
  return exiting;
}

void Log(TRITONSERVER_LogLevel level, const std::string& message) {
  TRITONSERVER_Error* error = TRITONSERVER_LogMessage(level, __FILE__, __LINE__, ("llama3_relay: " + message).c_str());
  if (error != nullptr) TRITONSERVER_ErrorDelete(error);
}

std::string Failure(TRITONSERVER_Error* error) {
  if (error == nullptr) return "";
  std::string message = TRITONSERVER_ErrorMessage(error);
  TRITONSERVER_ErrorDelete(error);
  return message.empty() ? "unknown error" : message;
}

void LogFailure(TRITONSERVER_Error* error, const char* what) {
  const std::string message = Failure(error);
  if (!message.empty()) Log(TRITONSERVER_LOG_ERROR, std::string(what) + ": " + message);
}

uint64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void ReleaseAll(const std::vector<Finished>& finished) {
  for (const Finished& done : finished) {
    const uint64_t now = NowNs();
    LogFailure(TRITONBACKEND_ModelInstanceReportStatistics(done.instance, done.request, done.success, done.arrived_ns,
                                                           done.arrived_ns, now, now),
               "statistics");
    LogFailure(TRITONBACKEND_RequestRelease(done.request, TRITONSERVER_REQUEST_RELEASE_ALL), "release");
  }
}

// The model config as JSON text (Triton writes it compactly).
TRITONSERVER_Error* ConfigJson(TRITONBACKEND_Model* model, std::string* text) {
  TRITONSERVER_Message* config = nullptr;
  TRITONSERVER_Error* error = TRITONBACKEND_ModelConfig(model, 1, &config);
  if (error != nullptr) return error;
  const char* json = nullptr;
  size_t json_size = 0;
  error = TRITONSERVER_MessageSerializeToJson(config, &json, &json_size);
  if (error == nullptr) text->assign(json, json_size);
  LogFailure(TRITONSERVER_MessageDelete(config), "model config");
  return error;
}

TRITONSERVER_Error* Relay::Create(TRITONBACKEND_Model* model, const std::string& config_json, Relay** out) {
  std::unique_ptr<Relay> relay(new Relay());
  const char* name = nullptr;
  TRITONSERVER_Error* error = TRITONBACKEND_ModelName(model, &name);
  if (error != nullptr) return error;
  relay->model_name_ = name;
  error = TRITONBACKEND_ModelServer(model, &relay->server_);
  if (error != nullptr) return error;
  relay->python_model_ = ConfigParameter(config_json, "python_model_name");
  relay->engine_models_ = NameList(ConfigParameter(config_json, "engine_models"));
  std::string thread_name = ConfigParameter(config_json, "thread_name");
  if (relay->python_model_.empty()) {
    return InvalidConfig("config.pbtxt needs the parameter python_model_name (the model whose responses this one "
                         "sends)");
  }
  if (relay->engine_models_.count(relay->model_name_) != 0) {
    return InvalidConfig("engine_models names this model itself (" + relay->model_name_ + ")");
  }
  if (thread_name.empty()) thread_name = kDefaultThreadName;
  if (thread_name.size() > kMaxThreadName) {
    return InvalidConfig("the parameter thread_name '" + thread_name + "' is longer than " +
                         std::to_string(kMaxThreadName) + " characters");
  }
  error = NewChildAllocator(&relay->allocator_);
  if (error != nullptr) return error;
  error = NewEngineAllocator(&relay->engine_allocator_);
  if (error != nullptr) return error;
  error = relay->Listen();
  if (error != nullptr) return error;
  relay->StartReader(thread_name);
  std::string engines;
  for (const std::string& engine : relay->engine_models_) engines += (engines.empty() ? "" : ", ") + engine;
  Log(TRITONSERVER_LOG_INFO, relay->model_name_ + ": sends the responses of " + relay->python_model_ +
                                 " (its processes connect to " + relay->socket_path_ + "); engine calls to: " +
                                 (engines.empty() ? "none" : engines));
  *out = relay.release();
  return nullptr;
}

}  // namespace llama3_relay

using llama3_relay::Handoff;
using llama3_relay::Log;
using llama3_relay::ModelRole;
using llama3_relay::Relay;

extern "C" {

// The server's backend API must be the one this library was compiled against or a later minor version of it, as
// Triton's backend examples check.
TRITONSERVER_Error* TRITONBACKEND_Initialize(TRITONBACKEND_Backend*) {
  uint32_t major = 0;
  uint32_t minor = 0;
  TRITONSERVER_Error* error = TRITONBACKEND_ApiVersion(&major, &minor);
  if (error != nullptr) return error;
  if (major != TRITONBACKEND_API_VERSION_MAJOR || minor < TRITONBACKEND_API_VERSION_MINOR) {
    const std::string message =
        "llama3_relay: this tritonserver's backend API is version " + std::to_string(major) + "." +
        std::to_string(minor) + "; the relay was compiled against " + std::to_string(TRITONBACKEND_API_VERSION_MAJOR) +
        "." + std::to_string(TRITONBACKEND_API_VERSION_MINOR) +
        " and needs the same major version and at least that minor version: build the repository (make repo) "
        "against this server's headers (/opt/tritonserver/include) or the relay's own (relay/include, Triton 2.51)";
    return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_UNSUPPORTED, message.c_str());
  }
  Log(TRITONSERVER_LOG_VERBOSE, "backend API " + std::to_string(major) + "." + std::to_string(minor) +
                                    ", compiled against " + std::to_string(TRITONBACKEND_API_VERSION_MAJOR) + "." +
                                    std::to_string(TRITONBACKEND_API_VERSION_MINOR));
  return nullptr;
}

TRITONSERVER_Error* TRITONBACKEND_Finalize(TRITONBACKEND_Backend*) {
  llama3_relay::UnchainStopSignals();
  return nullptr;
}

// A model whose config names `handoff_to` is the ensemble's handoff (handoff.h); any other is a relay.
TRITONSERVER_Error* TRITONBACKEND_ModelInitialize(TRITONBACKEND_Model* model) {
  std::string config;
  TRITONSERVER_Error* error = llama3_relay::ConfigJson(model, &config);
  if (error != nullptr) return error;
  ModelRole* role = nullptr;
  const std::string engine = llama3_relay::ConfigParameter(config, "handoff_to");
  if (engine.empty()) {
    Relay* relay = nullptr;
    error = Relay::Create(model, config, &relay);
    role = relay;
  } else {
    const std::string threads = llama3_relay::ConfigParameter(config, "sender_threads");
    char* end = nullptr;
    const unsigned long count = std::strtoul(threads.c_str(), &end, 10);
    if (threads.empty() || *end != '\0' || count > 256) {
      return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INVALID_ARG,
                                   ("llama3_relay: the parameter sender_threads must be a number from 1 to 256, not '" +
                                    threads + "'").c_str());
    }
    Handoff* handoff = nullptr;
    // The ensemble's request metrics carry its name (request_metrics.h); metrics_model "" turns them off.
    const bool named = config.find("\"metrics_model\"") != std::string::npos;
    const std::string metrics_model = named ? llama3_relay::ConfigParameter(config, "metrics_model") : "ensemble";
    error = Handoff::Create(model, engine, static_cast<uint32_t>(count), metrics_model, &handoff);
    role = handoff;
  }
  if (error != nullptr) return error;
  error = TRITONBACKEND_ModelSetState(model, role);
  if (error != nullptr) delete role;  // nothing was started through it yet
  return error;
}

TRITONSERVER_Error* TRITONBACKEND_ModelFinalize(TRITONBACKEND_Model* model) {
  void* state = nullptr;
  TRITONSERVER_Error* error = TRITONBACKEND_ModelState(model, &state);
  ModelRole* role = static_cast<ModelRole*>(state);
  if (role != nullptr && !role->StopAll()) {
    // Triton may still call back into it: leaked rather than freed under those callbacks.
    Log(TRITONSERVER_LOG_ERROR, "engine requests still running at unload after 30 s; the model's memory is left allocated");
    return error;
  }
  delete role;
  return error;
}

TRITONSERVER_Error* TRITONBACKEND_ModelInstanceExecute(TRITONBACKEND_ModelInstance* instance,
                                                       TRITONBACKEND_Request** requests, const uint32_t count) {
  TRITONBACKEND_Model* model = nullptr;
  void* state = nullptr;
  TRITONSERVER_Error* error = TRITONBACKEND_ModelInstanceModel(instance, &model);
  if (error == nullptr) error = TRITONBACKEND_ModelState(model, &state);
  if (error != nullptr) return error;  // Triton then fails every request with it
  static_cast<ModelRole*>(state)->Execute(instance, requests, count);
  return nullptr;
}

}  // extern "C"
