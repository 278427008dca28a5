// The ensemble's request metrics (request_metrics.h).
#include "request_metrics.h"

namespace llama3_relay {

const std::vector<double> kTimeToFirstTokenBuckets = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                                      1.0,   2.5,  5.0,   10.0, 30.0, 60.0};
const std::vector<double> kTimePerOutputTokenBuckets = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                                                        0.075, 0.1,    0.25,  0.5,  1.0,   2.5};
const std::vector<double> kE2eRequestLatencyBuckets = {0.05, 0.1,  0.25, 0.5,  1.0,   2.5,
                                                       5.0,  10.0, 30.0, 60.0, 120.0, 300.0};

namespace {

constexpr double kNsPerS = 1e9;

struct Labels {
  std::vector<TRITONSERVER_Parameter*> owned;
  std::vector<const TRITONSERVER_Parameter*> view;
  void Add(const char* key, const std::string& value) {
    owned.push_back(TRITONSERVER_ParameterNew(key, TRITONSERVER_PARAMETER_STRING, value.c_str()));
    view.push_back(owned.back());
  }
  ~Labels() {
    for (TRITONSERVER_Parameter* label : owned) TRITONSERVER_ParameterDelete(label);
  }
};

}  // namespace

std::string RequestMetrics::Create(const std::string& model) {
  std::string failure;
  first_token_ = Histogram("llm_time_to_first_token_seconds",
                           "Time from the request's arrival to its first generated token", kTimeToFirstTokenBuckets,
                           model, &failure);
  if (failure.empty()) {
    per_token_ = Histogram("llm_time_per_output_token_seconds",
                           "Mean time per output token after the first, one observation per request",
                           kTimePerOutputTokenBuckets, model, &failure);
  }
  if (failure.empty()) {
    e2e_ = Histogram("llm_e2e_request_latency_seconds", "Time from the request's arrival to its last response",
                     kE2eRequestLatencyBuckets, model, &failure);
  }
  if (failure.empty()) {
    prompt_ = Counter("llm_prompt_tokens_total", "Prompt tokens of finished requests", model, nullptr, &failure);
  }
  if (failure.empty()) {
    generated_ = Counter("llm_generation_tokens_total", "Generated tokens of finished requests", model, nullptr,
                         &failure);
  }
  const char* finished = "Finished generations by finish reason";
  if (failure.empty()) stop_ = Counter("llm_requests_total", finished, model, "stop", &failure);
  if (failure.empty()) length_ = Counter("llm_requests_total", finished, model, "length", &failure);
  if (failure.empty()) cancelled_ = Counter("llm_requests_total", finished, model, "cancelled", &failure);
  return failure;
}

RequestMetrics::~RequestMetrics() {
  for (TRITONSERVER_Metric* metric : metrics_) LogFailure(TRITONSERVER_MetricDelete(metric), "metric");
  for (TRITONSERVER_MetricFamily* family : families_) LogFailure(TRITONSERVER_MetricFamilyDelete(family), "metric family");
}

TRITONSERVER_MetricFamily* RequestMetrics::Family(const char* name, const char* description,
                                                  TRITONSERVER_MetricKind kind, std::string* failure) {
  TRITONSERVER_MetricFamily* family = nullptr;
  *failure = Failure(TRITONSERVER_MetricFamilyNew(&family, kind, name, description));
  if (failure->empty()) families_.push_back(family);
  return family;
}

TRITONSERVER_Metric* RequestMetrics::Histogram(const char* name, const char* description,
                                               const std::vector<double>& buckets, const std::string& model,
                                               std::string* failure) {
  TRITONSERVER_MetricFamily* family = Family(name, description, TRITONSERVER_METRIC_KIND_HISTOGRAM, failure);
  if (!failure->empty()) return nullptr;
  TRITONSERVER_MetricArgs* args = nullptr;
  *failure = Failure(TRITONSERVER_MetricArgsNew(&args));
  if (failure->empty()) *failure = Failure(TRITONSERVER_MetricArgsSetHistogram(args, buckets.data(), buckets.size()));
  Labels labels;
  labels.Add("model", model);
  TRITONSERVER_Metric* metric = nullptr;
  if (failure->empty()) {
    *failure = Failure(TRITONSERVER_MetricNewWithArgs(&metric, family, labels.view.data(), labels.view.size(), args));
  }
  if (args != nullptr) LogFailure(TRITONSERVER_MetricArgsDelete(args), "metric args");
  if (failure->empty()) metrics_.push_back(metric);
  return metric;
}

TRITONSERVER_Metric* RequestMetrics::Counter(const char* name, const char* description, const std::string& model,
                                             const char* finish_reason, std::string* failure) {
  // llm_requests_total has three metrics: its family is made once (Triton hands the same family back for the same
  // name and kind, but each handle must be deleted).
  TRITONSERVER_MetricFamily* family = Family(name, description, TRITONSERVER_METRIC_KIND_COUNTER, failure);
  if (!failure->empty()) return nullptr;
  Labels labels;
  labels.Add("model", model);
  if (finish_reason != nullptr) labels.Add("finish_reason", finish_reason);
  TRITONSERVER_Metric* metric = nullptr;
  *failure = Failure(TRITONSERVER_MetricNew(&metric, family, labels.view.data(), labels.view.size()));
  if (failure->empty()) metrics_.push_back(metric);
  return metric;
}

void RequestMetrics::OnTokens(RequestTiming* timing, int64_t tokens, uint64_t now_ns) {
  if (tokens <= 0) return;
  if (timing->first_token_ns == 0) {
    timing->first_token_ns = now_ns;
    timing->first_response_tokens = tokens;
    if (timing->streaming) {
      LogFailure(TRITONSERVER_MetricObserve(first_token_, (now_ns - timing->arrived_ns) / kNsPerS), "metric");
    }
  }
  timing->last_token_ns = now_ns;
  timing->generated += tokens;
}

void RequestMetrics::OnFinished(const RequestTiming& timing, uint64_t now_ns) {
  const int64_t later = timing.generated - timing.first_response_tokens;
  if (timing.streaming && later > 0) {
    const double per_token = (timing.last_token_ns - timing.first_token_ns) / kNsPerS / static_cast<double>(later);
    LogFailure(TRITONSERVER_MetricObserve(per_token_, per_token), "metric");
  }
  LogFailure(TRITONSERVER_MetricObserve(e2e_, (now_ns - timing.arrived_ns) / kNsPerS), "metric");
  LogFailure(TRITONSERVER_MetricIncrement(prompt_, static_cast<double>(timing.prompt_tokens)), "metric");
  LogFailure(TRITONSERVER_MetricIncrement(generated_, static_cast<double>(timing.generated)), "metric");
  TRITONSERVER_Metric* reason = timing.cancelled ? cancelled_
                                : (timing.max_tokens > 0 && timing.generated >= timing.max_tokens) ? length_
                                                                                                   : stop_;
  LogFailure(TRITONSERVER_MetricIncrement(reason, 1), "metric");
}

}  // namespace llama3_relay
