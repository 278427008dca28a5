// The part of Triton's C API (tritonserver.h, tritonbackend.h) that our C++ backends call: the relay
// (relay.cc) and the bench's send_cpp. Written out here so that building them needs no Triton header
// (the pytriton wheel ships none); the symbols resolve against the tritonserver that loads the library.
// Signatures and enum values are those of the headers at r24.10 (Triton 2.51: server API 1.33, backend API
// 1.19), unchanged in core's main of 2026 (server API 1.34); keep them in step with those headers.
#pragma once

#include <cstddef>
#include <cstdint>

extern "C" {
struct TRITONSERVER_Error;
struct TRITONSERVER_Server;
struct TRITONSERVER_Message;
struct TRITONSERVER_InferenceRequest;
struct TRITONSERVER_InferenceResponse;
struct TRITONSERVER_InferenceTrace;
struct TRITONSERVER_ResponseAllocator;
struct TRITONBACKEND_Model;
struct TRITONBACKEND_ModelInstance;
struct TRITONBACKEND_Request;
struct TRITONBACKEND_Input;
struct TRITONBACKEND_Output;
struct TRITONBACKEND_Response;
struct TRITONBACKEND_ResponseFactory;

enum TRITONSERVER_DataType {
  TRITONSERVER_TYPE_INVALID = 0,
  TRITONSERVER_TYPE_INT32 = 8,
  TRITONSERVER_TYPE_BYTES = 13,
  TRITONSERVER_TYPE_BF16 = 14,  // the last type
};
enum TRITONSERVER_MemoryType { TRITONSERVER_MEMORY_CPU = 0, TRITONSERVER_MEMORY_CPU_PINNED = 1 };
enum TRITONSERVER_ParameterType {
  TRITONSERVER_PARAMETER_STRING = 0,
  TRITONSERVER_PARAMETER_INT = 1,
  TRITONSERVER_PARAMETER_BOOL = 2,
  TRITONSERVER_PARAMETER_DOUBLE = 3,
  TRITONSERVER_PARAMETER_BYTES = 4,
};
enum TRITONSERVER_LogLevel {
  TRITONSERVER_LOG_INFO = 0,
  TRITONSERVER_LOG_WARN = 1,
  TRITONSERVER_LOG_ERROR = 2,
  TRITONSERVER_LOG_VERBOSE = 3,
};
enum TRITONSERVER_Error_Code {
  TRITONSERVER_ERROR_UNKNOWN = 0,
  TRITONSERVER_ERROR_INTERNAL = 1,
  TRITONSERVER_ERROR_NOT_FOUND = 2,
  TRITONSERVER_ERROR_INVALID_ARG = 3,
  TRITONSERVER_ERROR_UNAVAILABLE = 4,
  TRITONSERVER_ERROR_UNSUPPORTED = 5,
  TRITONSERVER_ERROR_ALREADY_EXISTS = 6,
  TRITONSERVER_ERROR_CANCELLED = 7,
};
const uint32_t TRITONSERVER_REQUEST_RELEASE_ALL = 1;
const uint32_t TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1;

typedef TRITONSERVER_Error* (*TRITONSERVER_ResponseAllocatorAllocFn_t)(
    TRITONSERVER_ResponseAllocator* allocator, const char* tensor_name, size_t byte_size,
    TRITONSERVER_MemoryType memory_type, int64_t memory_type_id, void* userp, void** buffer, void** buffer_userp,
    TRITONSERVER_MemoryType* actual_memory_type, int64_t* actual_memory_type_id);
typedef TRITONSERVER_Error* (*TRITONSERVER_ResponseAllocatorReleaseFn_t)(
    TRITONSERVER_ResponseAllocator* allocator, void* buffer, void* buffer_userp, size_t byte_size,
    TRITONSERVER_MemoryType memory_type, int64_t memory_type_id);
typedef TRITONSERVER_Error* (*TRITONSERVER_ResponseAllocatorStartFn_t)(TRITONSERVER_ResponseAllocator* allocator,
                                                                       void* userp);
typedef void (*TRITONSERVER_InferenceRequestReleaseFn_t)(TRITONSERVER_InferenceRequest* request,
                                                         const uint32_t flags, void* userp);
typedef void (*TRITONSERVER_InferenceResponseCompleteFn_t)(TRITONSERVER_InferenceResponse* response,
                                                           const uint32_t flags, void* userp);

// tritonserver.h
TRITONSERVER_Error* TRITONSERVER_ErrorNew(TRITONSERVER_Error_Code code, const char* msg);
void TRITONSERVER_ErrorDelete(TRITONSERVER_Error* error);
TRITONSERVER_Error_Code TRITONSERVER_ErrorCode(TRITONSERVER_Error* error);
const char* TRITONSERVER_ErrorMessage(TRITONSERVER_Error* error);
TRITONSERVER_Error* TRITONSERVER_LogMessage(TRITONSERVER_LogLevel level, const char* filename, const int line,
                                            const char* msg);
TRITONSERVER_Error* TRITONSERVER_MessageSerializeToJson(TRITONSERVER_Message* message, const char** base,
                                                        size_t* byte_size);
TRITONSERVER_Error* TRITONSERVER_MessageDelete(TRITONSERVER_Message* message);
TRITONSERVER_Error* TRITONSERVER_ResponseAllocatorNew(TRITONSERVER_ResponseAllocator** allocator,
                                                      TRITONSERVER_ResponseAllocatorAllocFn_t alloc_fn,
                                                      TRITONSERVER_ResponseAllocatorReleaseFn_t release_fn,
                                                      TRITONSERVER_ResponseAllocatorStartFn_t start_fn);
TRITONSERVER_Error* TRITONSERVER_ResponseAllocatorDelete(TRITONSERVER_ResponseAllocator* allocator);
TRITONSERVER_Error* TRITONSERVER_InferenceRequestNew(TRITONSERVER_InferenceRequest** inference_request,
                                                     TRITONSERVER_Server* server, const char* model_name,
                                                     const int64_t model_version);
TRITONSERVER_Error* TRITONSERVER_InferenceRequestDelete(TRITONSERVER_InferenceRequest* inference_request);
TRITONSERVER_Error* TRITONSERVER_InferenceRequestSetId(TRITONSERVER_InferenceRequest* inference_request,
                                                       const char* id);
TRITONSERVER_Error* TRITONSERVER_InferenceRequestAddInput(TRITONSERVER_InferenceRequest* inference_request,
                                                          const char* name, const TRITONSERVER_DataType datatype,
                                                          const int64_t* shape, uint64_t dim_count);
TRITONSERVER_Error* TRITONSERVER_InferenceRequestAddRequestedOutput(TRITONSERVER_InferenceRequest* inference_request,
                                                                    const char* name);
TRITONSERVER_Error* TRITONSERVER_InferenceRequestAppendInputData(TRITONSERVER_InferenceRequest* inference_request,
                                                                 const char* name, const void* base, size_t byte_size,
                                                                 TRITONSERVER_MemoryType memory_type,
                                                                 int64_t memory_type_id);
TRITONSERVER_Error* TRITONSERVER_InferenceRequestSetStringParameter(TRITONSERVER_InferenceRequest* request,
                                                                    const char* key, const char* value);
TRITONSERVER_Error* TRITONSERVER_InferenceRequestSetIntParameter(TRITONSERVER_InferenceRequest* request,
                                                                 const char* key, const int64_t value);
TRITONSERVER_Error* TRITONSERVER_InferenceRequestSetBoolParameter(TRITONSERVER_InferenceRequest* request,
                                                                  const char* key, const bool value);
TRITONSERVER_Error* TRITONSERVER_InferenceRequestSetDoubleParameter(TRITONSERVER_InferenceRequest* request,
                                                                    const char* key, const double value);
TRITONSERVER_Error* TRITONSERVER_InferenceRequestSetReleaseCallback(
    TRITONSERVER_InferenceRequest* inference_request, TRITONSERVER_InferenceRequestReleaseFn_t request_release_fn,
    void* request_release_userp);
TRITONSERVER_Error* TRITONSERVER_InferenceRequestSetResponseCallback(
    TRITONSERVER_InferenceRequest* inference_request, TRITONSERVER_ResponseAllocator* response_allocator,
    void* response_allocator_userp, TRITONSERVER_InferenceResponseCompleteFn_t response_fn, void* response_userp);
TRITONSERVER_Error* TRITONSERVER_InferenceRequestCancel(TRITONSERVER_InferenceRequest* inference_request);
TRITONSERVER_Error* TRITONSERVER_ServerInferAsync(TRITONSERVER_Server* server,
                                                  TRITONSERVER_InferenceRequest* inference_request,
                                                  TRITONSERVER_InferenceTrace* trace);
TRITONSERVER_Error* TRITONSERVER_InferenceResponseDelete(TRITONSERVER_InferenceResponse* inference_response);
TRITONSERVER_Error* TRITONSERVER_InferenceResponseError(TRITONSERVER_InferenceResponse* inference_response);
TRITONSERVER_Error* TRITONSERVER_InferenceResponseOutputCount(TRITONSERVER_InferenceResponse* inference_response,
                                                              uint32_t* count);
TRITONSERVER_Error* TRITONSERVER_InferenceResponseOutput(TRITONSERVER_InferenceResponse* inference_response,
                                                         const uint32_t index, const char** name,
                                                         TRITONSERVER_DataType* datatype, const int64_t** shape,
                                                         uint64_t* dim_count, const void** base, size_t* byte_size,
                                                         TRITONSERVER_MemoryType* memory_type, int64_t* memory_type_id,
                                                         void** userp);

// tritonbackend.h
TRITONSERVER_Error* TRITONBACKEND_ModelName(TRITONBACKEND_Model* model, const char** name);
TRITONSERVER_Error* TRITONBACKEND_ModelServer(TRITONBACKEND_Model* model, TRITONSERVER_Server** server);
TRITONSERVER_Error* TRITONBACKEND_ModelConfig(TRITONBACKEND_Model* model, const uint32_t config_version,
                                              TRITONSERVER_Message** model_config);
TRITONSERVER_Error* TRITONBACKEND_ModelState(TRITONBACKEND_Model* model, void** state);
TRITONSERVER_Error* TRITONBACKEND_ModelSetState(TRITONBACKEND_Model* model, void* state);
TRITONSERVER_Error* TRITONBACKEND_ModelInstanceModel(TRITONBACKEND_ModelInstance* instance,
                                                     TRITONBACKEND_Model** model);
TRITONSERVER_Error* TRITONBACKEND_RequestId(TRITONBACKEND_Request* request, const char** id);
TRITONSERVER_Error* TRITONBACKEND_RequestInputCount(TRITONBACKEND_Request* request, uint32_t* count);
TRITONSERVER_Error* TRITONBACKEND_RequestInputByIndex(TRITONBACKEND_Request* request, const uint32_t index,
                                                      TRITONBACKEND_Input** input);
TRITONSERVER_Error* TRITONBACKEND_RequestInput(TRITONBACKEND_Request* request, const char* name,
                                               TRITONBACKEND_Input** input);
TRITONSERVER_Error* TRITONBACKEND_InputProperties(TRITONBACKEND_Input* input, const char** name,
                                                  TRITONSERVER_DataType* datatype, const int64_t** shape,
                                                  uint32_t* dims_count, uint64_t* byte_size, uint32_t* buffer_count);
TRITONSERVER_Error* TRITONBACKEND_InputBuffer(TRITONBACKEND_Input* input, const uint32_t index, const void** buffer,
                                              uint64_t* buffer_byte_size, TRITONSERVER_MemoryType* memory_type,
                                              int64_t* memory_type_id);
TRITONSERVER_Error* TRITONBACKEND_RequestOutputCount(TRITONBACKEND_Request* request, uint32_t* count);
TRITONSERVER_Error* TRITONBACKEND_RequestOutputName(TRITONBACKEND_Request* request, const uint32_t index,
                                                    const char** output_name);
TRITONSERVER_Error* TRITONBACKEND_RequestParameterCount(TRITONBACKEND_Request* request, uint32_t* count);
TRITONSERVER_Error* TRITONBACKEND_RequestParameter(TRITONBACKEND_Request* request, const uint32_t index,
                                                   const char** key, TRITONSERVER_ParameterType* type,
                                                   const void** vvalue);
TRITONSERVER_Error* TRITONBACKEND_RequestRelease(TRITONBACKEND_Request* request, uint32_t release_flags);
TRITONSERVER_Error* TRITONBACKEND_ResponseFactoryNew(TRITONBACKEND_ResponseFactory** factory,
                                                     TRITONBACKEND_Request* request);
TRITONSERVER_Error* TRITONBACKEND_ResponseFactoryDelete(TRITONBACKEND_ResponseFactory* factory);
TRITONSERVER_Error* TRITONBACKEND_ResponseFactorySendFlags(TRITONBACKEND_ResponseFactory* factory,
                                                           const uint32_t send_flags);
TRITONSERVER_Error* TRITONBACKEND_ResponseFactoryIsCancelled(TRITONBACKEND_ResponseFactory* factory,
                                                             bool* is_cancelled);
TRITONSERVER_Error* TRITONBACKEND_ResponseNewFromFactory(TRITONBACKEND_Response** response,
                                                         TRITONBACKEND_ResponseFactory* factory);
TRITONSERVER_Error* TRITONBACKEND_ResponseOutput(TRITONBACKEND_Response* response, TRITONBACKEND_Output** output,
                                                 const char* name, const TRITONSERVER_DataType datatype,
                                                 const int64_t* shape, const uint32_t dims_count);
TRITONSERVER_Error* TRITONBACKEND_OutputBuffer(TRITONBACKEND_Output* output, void** buffer,
                                               const uint64_t buffer_byte_size, TRITONSERVER_MemoryType* memory_type,
                                               int64_t* memory_type_id);
TRITONSERVER_Error* TRITONBACKEND_ModelInstanceReportStatistics(TRITONBACKEND_ModelInstance* instance,
                                                              TRITONBACKEND_Request* request, const bool success,
                                                              const uint64_t exec_start_ns,
                                                              const uint64_t compute_start_ns,
                                                              const uint64_t compute_end_ns, const uint64_t exec_end_ns);
TRITONSERVER_Error* TRITONBACKEND_ModelInstanceReportBatchStatistics(TRITONBACKEND_ModelInstance* instance,
                                                                   const uint64_t batch_size,
                                                                   const uint64_t exec_start_ns,
                                                                   const uint64_t compute_start_ns,
                                                                   const uint64_t compute_end_ns,
                                                                   const uint64_t exec_end_ns);
TRITONSERVER_Error* TRITONBACKEND_ResponseSend(TRITONBACKEND_Response* response, const uint32_t send_flags,
                                               TRITONSERVER_Error* error);
}
