// Triton's entry points (TRITONBACKEND_*) and the model's config: one Engine per model (its one step thread), the
// requests of every instance handed to it.
#include <chrono>
#include <cstdlib>

#include "engine.h"

namespace bench_engine {

std::string Failure(TRITONSERVER_Error* error) {
  if (error == nullptr) return "";
  std::string message = TRITONSERVER_ErrorMessage(error);
  TRITONSERVER_ErrorDelete(error);
  return message.empty() ? "unknown error" : message;
}

void Log(TRITONSERVER_LogLevel level, const std::string& message) {
  TRITONSERVER_Error* error = TRITONSERVER_LogMessage(level, __FILE__, __LINE__, ("bench_engine: " + message).c_str());
  if (error != nullptr) TRITONSERVER_ErrorDelete(error);
}

void LogFailure(TRITONSERVER_Error* error, const char* what) {
  const std::string message = Failure(error);
  if (!message.empty()) Log(TRITONSERVER_LOG_ERROR, std::string(what) + ": " + message);
}

uint64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

namespace {

constexpr size_t kMaxThreadName = 15;  // Linux's limit, without the NUL

TRITONSERVER_Error* InvalidConfig(const std::string& message) {
  return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INVALID_ARG, ("bench_engine: " + message).c_str());
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

// A whole number in [low, high] from parameter `key`, or an error naming it.
TRITONSERVER_Error* Number(const std::string& json, const char* key, long low, long high, long* out) {
  const std::string text = ConfigParameter(json, key);
  char* end = nullptr;
  *out = std::strtol(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || *out < low || *out > high) {
    return InvalidConfig(std::string("the parameter ") + key + " must be a whole number from " + std::to_string(low) +
                         " to " + std::to_string(high) + ", not '" + text + "'");
  }
  return nullptr;
}

TRITONSERVER_Error* ReadSettings(TRITONBACKEND_Model* model, Settings* settings) {
  TRITONSERVER_Message* message = nullptr;
  TRITONSERVER_Error* error = TRITONBACKEND_ModelConfig(model, 1, &message);
  if (error != nullptr) return error;
  const char* text = nullptr;
  size_t size = 0;
  error = TRITONSERVER_MessageSerializeToJson(message, &text, &size);
  const std::string json = error == nullptr ? std::string(text, size) : "";
  LogFailure(TRITONSERVER_MessageDelete(message), "model config");
  if (error != nullptr) return error;
  const char* name = nullptr;
  error = TRITONBACKEND_ModelName(model, &name);
  if (error != nullptr) return error;
  settings->model_name = name;
  long value = 0;
  if ((error = Number(json, "max_active_requests", 1, 1 << 20, &value)) != nullptr) return error;
  settings->max_active = static_cast<uint32_t>(value);
  if ((error = Number(json, "max_queued_requests", 0, 1 << 20, &value)) != nullptr) return error;
  settings->max_queued = static_cast<uint32_t>(value);
  const std::string step = ConfigParameter(json, "step_ms");
  char* end = nullptr;
  settings->step_ms = std::strtod(step.c_str(), &end);
  if (step.empty() || *end != '\0' || settings->step_ms < 0 || settings->step_ms > 60000) {
    return InvalidConfig("the parameter step_ms must be a number of ms from 0 (unpaced) to 60000, not '" + step + "'");
  }
  // exclude_input_in_output=false would put the prompt before a non-streamed output: the bench sends none.
  if (ConfigParameter(json, "exclude_input_in_output") != "true") {
    return InvalidConfig("the parameter exclude_input_in_output must be true: the bench engine never echoes the "
                         "prompt");
  }
  const std::string cycle = ConfigParameter(json, "text_cycle");
  for (size_t start = 0; start < cycle.size();) {
    size_t stop = cycle.find(',', start);
    if (stop == std::string::npos) stop = cycle.size();
    const std::string item = cycle.substr(start, stop - start);
    const long token = std::strtol(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || token < 0 || token > INT32_MAX) {
      return InvalidConfig("the parameter text_cycle must be token ids separated by commas, not '" + cycle + "'");
    }
    settings->cycle.push_back(static_cast<int32_t>(token));
    start = stop + 1;
  }
  if (settings->cycle.empty()) return InvalidConfig("the parameter text_cycle names no token");
  settings->thread_name = ConfigParameter(json, "thread_name");
  if (settings->thread_name.empty() || settings->thread_name.size() > kMaxThreadName) {
    return InvalidConfig("the parameter thread_name must have 1 to " + std::to_string(kMaxThreadName) +
                         " characters, not '" + settings->thread_name + "'");
  }
  return nullptr;
}

}  // namespace
}  // namespace bench_engine

extern "C" {

// The server's backend API must be the one this library was compiled against or a later minor version of it, as
// Triton's backend examples check.
TRITONSERVER_Error* TRITONBACKEND_Initialize(TRITONBACKEND_Backend*) {
  uint32_t major = 0;
  uint32_t minor = 0;
  TRITONSERVER_Error* error = TRITONBACKEND_ApiVersion(&major, &minor);
  if (error != nullptr) return error;
  if (major != TRITONBACKEND_API_VERSION_MAJOR || minor < TRITONBACKEND_API_VERSION_MINOR) {
    const std::string message = "bench_engine: this tritonserver's backend API is version " + std::to_string(major) +
                                "." + std::to_string(minor) + "; the library was compiled against " +
                                std::to_string(TRITONBACKEND_API_VERSION_MAJOR) + "." +
                                std::to_string(TRITONBACKEND_API_VERSION_MINOR);
    return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_UNSUPPORTED, message.c_str());
  }
  return nullptr;
}

TRITONSERVER_Error* TRITONBACKEND_ModelInitialize(TRITONBACKEND_Model* model) {
  bench_engine::Settings settings;
  TRITONSERVER_Error* error = bench_engine::ReadSettings(model, &settings);
  if (error != nullptr) return error;
  bench_engine::Log(TRITONSERVER_LOG_INFO, settings.model_name + ": step " + std::to_string(settings.step_ms) +
                                               " ms, " + std::to_string(settings.max_active) + " active + " +
                                               std::to_string(settings.max_queued) + " queued sequences at most");
  auto* engine = new bench_engine::Engine(std::move(settings));
  error = TRITONBACKEND_ModelSetState(model, engine);
  if (error != nullptr) delete engine;
  return error;
}

TRITONSERVER_Error* TRITONBACKEND_ModelFinalize(TRITONBACKEND_Model* model) {
  void* state = nullptr;
  TRITONSERVER_Error* error = TRITONBACKEND_ModelState(model, &state);
  delete static_cast<bench_engine::Engine*>(state);
  return error;
}

TRITONSERVER_Error* TRITONBACKEND_ModelInstanceExecute(TRITONBACKEND_ModelInstance* instance,
                                                       TRITONBACKEND_Request** requests, const uint32_t count) {
  TRITONBACKEND_Model* model = nullptr;
  void* state = nullptr;
  TRITONSERVER_Error* error = TRITONBACKEND_ModelInstanceModel(instance, &model);
  if (error == nullptr) error = TRITONBACKEND_ModelState(model, &state);
  if (error != nullptr) return error;  // Triton then fails every request with it
  static_cast<bench_engine::Engine*>(state)->Admit(instance, requests, count);
  return nullptr;
}

}  // extern "C"
