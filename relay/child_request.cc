// A request received by this backend, copied onto a new in-process request (the relay's child to the Python model,
// the handoff's to the engine): its id, inputs (by reference: the received request must outlive the new one) and
// request parameters.
#include <cstring>

#include "relay.h"

namespace llama3_relay {

std::string CopyRequest(TRITONBACKEND_Request* from, TRITONSERVER_InferenceRequest* to,
                        const std::vector<const char*>& reserved_parameters) {
  const char* id = nullptr;
  std::string failure = Failure(TRITONBACKEND_RequestId(from, &id));
  if (failure.empty() && id != nullptr && id[0] != '\0') failure = Failure(TRITONSERVER_InferenceRequestSetId(to, id));

  uint32_t count = 0;
  if (failure.empty()) failure = Failure(TRITONBACKEND_RequestInputCount(from, &count));
  for (uint32_t i = 0; failure.empty() && i < count; ++i) {
    TRITONBACKEND_Input* input = nullptr;
    const char* name = nullptr;
    TRITONSERVER_DataType datatype = TRITONSERVER_TYPE_INVALID;
    const int64_t* shape = nullptr;
    uint32_t dims = 0;
    uint64_t byte_size = 0;
    uint32_t buffers = 0;
    failure = Failure(TRITONBACKEND_RequestInputByIndex(from, i, &input));
    if (failure.empty()) {
      failure = Failure(TRITONBACKEND_InputProperties(input, &name, &datatype, &shape, &dims, &byte_size, &buffers));
    }
    if (failure.empty()) failure = Failure(TRITONSERVER_InferenceRequestAddInput(to, name, datatype, shape, dims));
    for (uint32_t b = 0; failure.empty() && b < buffers; ++b) {
      const void* data = nullptr;
      uint64_t size = 0;
      TRITONSERVER_MemoryType memory_type = TRITONSERVER_MEMORY_CPU;
      int64_t memory_type_id = 0;
      failure = Failure(TRITONBACKEND_InputBuffer(input, b, &data, &size, &memory_type, &memory_type_id));
      if (failure.empty()) {
        failure = Failure(TRITONSERVER_InferenceRequestAppendInputData(to, name, data, size, memory_type, memory_type_id));
      }
    }
  }

  count = 0;
  if (failure.empty()) failure = Failure(TRITONBACKEND_RequestParameterCount(from, &count));
  for (uint32_t i = 0; failure.empty() && i < count; ++i) {
    const char* key = nullptr;
    TRITONSERVER_ParameterType type = TRITONSERVER_PARAMETER_STRING;
    const void* value = nullptr;
    failure = Failure(TRITONBACKEND_RequestParameter(from, i, &key, &type, &value));
    if (!failure.empty()) break;
    for (const char* reserved : reserved_parameters) {
      if (std::strcmp(key, reserved) == 0) return std::string("INVALID:") + key + " is not an input of this model";
    }
    switch (type) {
      case TRITONSERVER_PARAMETER_STRING:
        failure = Failure(TRITONSERVER_InferenceRequestSetStringParameter(to, key, static_cast<const char*>(value)));
        break;
      case TRITONSERVER_PARAMETER_INT:
        failure = Failure(TRITONSERVER_InferenceRequestSetIntParameter(to, key, *static_cast<const int64_t*>(value)));
        break;
      case TRITONSERVER_PARAMETER_BOOL:
        failure = Failure(TRITONSERVER_InferenceRequestSetBoolParameter(to, key, *static_cast<const bool*>(value)));
        break;
      case TRITONSERVER_PARAMETER_DOUBLE:
        failure = Failure(TRITONSERVER_InferenceRequestSetDoubleParameter(to, key, *static_cast<const double*>(value)));
        break;
      default:  // no frontend makes one; refused rather than dropped
        return std::string("INVALID:") + key + ": binary request parameters are not supported";
    }
  }
  return failure;
}

}  // namespace llama3_relay
