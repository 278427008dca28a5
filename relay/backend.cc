// Triton's entry points (TRITONBACKEND_*), the model's config, and what every part of the relay shares.
#include <memory>

#include "relay.h"

namespace llama3_relay {
namespace {

// The reader thread's name unless the config's `thread_name` parameter gives another: the bench's CPU accounting
// tells relays apart by it (testkit/processes.py), e.g. the BLS's from the one in front of the benchmark engine.
constexpr const char* kDefaultThreadName = "llama3_relay";
constexpr size_t kMaxThreadName = 15;  // Linux's limit, without the NUL

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

TRITONSERVER_Error* InvalidConfig(const std::string& message) {
  return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INVALID_ARG, ("llama3_relay: " + message).c_str());
}

}  // namespace

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
    const std::string text(json, json_size);
    relay->python_model_ = ConfigParameter(text, "python_model_name");
    relay->engine_models_ = NameList(ConfigParameter(text, "engine_models"));
    thread_name = ConfigParameter(text, "thread_name");
  }
  LogFailure(TRITONSERVER_MessageDelete(config), "model config");
  if (error != nullptr) return error;
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

using llama3_relay::Log;
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
