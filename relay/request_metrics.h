// The request metrics of the ensemble, measured where its engine step runs: the handoff (handoff.h) sees each
// engine request arrive, each engine response and the stream's end, in order, on the stream's sender thread.
//
// Names, buckets and meaning are bls/llm_metrics.py's (the one definition; tests/unit/test_llm_metrics.py holds
// this file to it), labelled model="ensemble", beside tensorrt_llm_bls's series of the same families: Triton's
// registry shares a family between the Python backend and this library (same name and kind), and deleting either's
// handle never removes it from the registry (core src/metric_family.cc, r24.10 to main: DLIS-4072; a metric of the
// same labels is reference-counted), so either model unloads without touching the other's series.
//
// What differs from the BLS's: time runs from the engine step's arrival, i.e. after the ensemble's preprocessing
// step (tokenization; no backend API gives the ensemble request's own arrival), and a non-streamed request has no
// first-token or per-token observation (the engine answers it once, at its end).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "relay.h"

namespace llama3_relay {

// What the handoff learnt of one ensemble request; times from NowNs().
struct RequestTiming {
  uint64_t arrived_ns = 0;
  int64_t prompt_tokens = 0;
  int64_t max_tokens = 0;  // request_output_len
  bool streaming = false;
  bool prompt_in_output = false;  // unstreamed with exclude_input_in_output false: the response repeats the prompt
  uint64_t first_token_ns = 0;
  uint64_t last_token_ns = 0;
  int64_t first_response_tokens = 0;
  int64_t generated = 0;
  bool cancelled = false;
};

class RequestMetrics {
 public:
  // Families and the metrics of `model`; "" or why not (the handoff then loads without them and says so).
  std::string Create(const std::string& model);
  ~RequestMetrics();

  // An engine response carrying `tokens` output tokens (the prompt already subtracted), at `now_ns`.
  void OnTokens(RequestTiming* timing, int64_t tokens, uint64_t now_ns);
  // The stream's end without an error (errors are counted by Triton: nv_inference_request_failure).
  void OnFinished(const RequestTiming& timing, uint64_t now_ns);

 private:
  TRITONSERVER_Metric* Histogram(const char* name, const char* description, const std::vector<double>& buckets,
                                 const std::string& model, std::string* failure);
  TRITONSERVER_Metric* Counter(const char* name, const char* description, const std::string& model,
                               const char* finish_reason, std::string* failure);
  TRITONSERVER_MetricFamily* Family(const char* name, const char* description, TRITONSERVER_MetricKind kind,
                                    std::string* failure);

  std::vector<TRITONSERVER_MetricFamily*> families_;
  std::vector<TRITONSERVER_Metric*> metrics_;  // deleted before the families
  TRITONSERVER_Metric* first_token_ = nullptr;
  TRITONSERVER_Metric* per_token_ = nullptr;
  TRITONSERVER_Metric* e2e_ = nullptr;
  TRITONSERVER_Metric* prompt_ = nullptr;
  TRITONSERVER_Metric* generated_ = nullptr;
  TRITONSERVER_Metric* stop_ = nullptr;
  TRITONSERVER_Metric* length_ = nullptr;
  TRITONSERVER_Metric* cancelled_ = nullptr;
};

// Bucket edges in seconds: bls/llm_metrics.py's.
extern const std::vector<double> kTimeToFirstTokenBuckets;
extern const std::vector<double> kTimePerOutputTokenBuckets;
extern const std::vector<double> kE2eRequestLatencyBuckets;

}  // namespace llama3_relay
