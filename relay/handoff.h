// The handoff: the ensemble's engine step (tensorrt_llm_handoff in a built repository, model_repository/tensorrt_llm_handoff/config.pbtxt).
//
// Why: Triton runs an ensemble's scheduling of each response of a step inside the ResponseSend that sends it, on
// the sender's thread (core's EnsembleContext::ResponseComplete: the response's tensors, the next step's request
// and its enqueue; a decoupled step's callbacks stay on that thread in later servers too, to keep their order).
// The engine sends every stream's responses from one thread (TensorRT-LLM's backend has one response thread per
// model instance), so that work, which grows with the 20 outputs of the 1.2 engine the ensemble maps, is done
// serially for all streams and caps what the ensemble streams (docs/benchmarks.md, "The ensemble on a many-core
// host").
//
// What it does: each request is forwarded unchanged (inputs by reference, requested outputs, id, correlation id,
// flags, timeout, parameters) to the engine (config parameter `handoff_to`) in-process. The engine's thread only
// queues each of its responses; `sender_threads` threads re-send them on the ensemble's request, which runs the
// ensemble's scheduling there. A stream's responses all go through one sender, in the order they came. A sender
// takes its whole queue at once; the responses of one stream in it that merge.h allows to merge (a stream of one
// sequence: batch 1, one beam, one return sequence; token ids, counts and perf metrics only: what TensorRT-LLM
// 1.2.1's backend sends for a step, merge.h cites where) go out as one response, as the backend would have sent
// them had the engine made their tokens in one step, so that Triton schedules the ensemble's later steps
// (postprocessing among them) once for them: the ensemble's work per token falls when it falls behind the engine.
// Nothing waits to be merged: a stream whose responses each find the sender idle gets one response per token, as
// the engine sent them. Errors are passed on as they are (never merged). Exact streamed text: to a request that
// asks for its own output preceding_ids (the ensemble does; not passed to the engine), it adds it to every response
// (a merged one's ids taken as one response's) from the stream's first token that is part of a character on (told by a byte per token id that make repo writes from the tokenizer): the stream's last ids
// before this response, then -1 where the stream ends here, from which postprocessing decodes complete characters
// only; the responses before it (whole characters only: English text throughout) are decoded alone, as NVIDIA's are
// (bls/contract.py HANDOFF_TEXT_STATE; docs/design.md, "Streaming through the ensemble"). Cancellation: Triton's
// ensemble cancels a step request only when it schedules the step, so the handoff sees it on arrival (answered CANCELLED, the engine never called) or, should a server pass it on
// later, before a response is re-sent (the engine request is cancelled). Request priority (no backend API reads
// it) and traces are not carried. Shutdown: once tritonserver begins to stop (relay.h, kShutdownMessage), a thread of
// the handoff cancels every engine request it forwarded, and each stream ends with the shutdown's error at its next
// response (the engine answers a cancellation with a final response at once).
//
// What Triton no longer knows: its model dependency graph is built from ensemble steps only, so with the handoff
// the ensemble depends on the handoff, not on the engine. Loading `ensemble` alone (explicit model control) does
// not load tensorrt_llm, and an engine that failed to load or was unloaded leaves the ensemble READY, its requests
// failing with the engine's "not found" error (docs/operations.md, "Health and readiness").
#pragma once

#include <condition_variable>
#include <deque>
#include <unordered_set>

#include "merge.h"
#include "relay.h"
#include "request_metrics.h"

namespace llama3_relay {

struct HandoffStream;

class Handoff : public ModelRole {
 public:
  // metrics_model: the model label of the ensemble's request metrics (request_metrics.h); "" for none.
  static TRITONSERVER_Error* Create(TRITONBACKEND_Model* model, const std::string& engine, uint32_t sender_threads,
                                    const std::string& metrics_model, Handoff** handoff);
  ~Handoff() override;

  void Execute(TRITONBACKEND_ModelInstance* instance, TRITONBACKEND_Request** requests, uint32_t count) override;
  bool StopAll() override;

 private:
  // An engine response (null with the final flag alone) on its way to a sender.
  struct Delivery {
    HandoffStream* stream = nullptr;
    TRITONSERVER_InferenceResponse* response = nullptr;
    uint32_t flags = 0;
    // Read on the sender's thread (ReadOutputs), for a response without an error:
    EngineOutputs outputs;
    std::string failure;  // why its outputs could not be read ("" when they were)
    bool mergeable = false;  // merge.h: Mergeable, and its stream is one sequence
  };
  struct Sender {
    std::mutex mutex;
    std::condition_variable ready;  // something to send, or stopping
    std::condition_variable room;  // the queue fell below kMaxQueued
    std::deque<Delivery> queue;
    std::thread thread;
  };
  // Responses one sender may hold: past it the engine's thread waits, as it would sending them itself, so an engine
  // that outruns the ensemble is held back instead of filling memory.
  static constexpr size_t kMaxQueued = 65536;

  Handoff() = default;
  void Forward(TRITONBACKEND_ModelInstance* instance, TRITONBACKEND_Request* request);
  // Builds the engine request and hands it to Triton: "" or why not, and the code its client gets (the engine's own
  // refusal passes as it is).
  std::string Start(HandoffStream* stream, TRITONSERVER_Error_Code* code);
  // A sender's thread: takes its whole queue at once, and sends each stream's responses of it that may merge
  // (merge.h) as one response, the others as they came.
  void Send(Sender* sender);
  static void ReadOutputs(Delivery* delivery);
  void Deliver(const std::vector<Delivery*>& group);
  static void OnEngineResponse(TRITONSERVER_InferenceResponse* response, const uint32_t flags, void* userp);
  static void OnEngineReleased(TRITONSERVER_InferenceRequest* request, const uint32_t flags, void* userp);
  // Once the engine request is released and the stream's final response has gone: the stream is forgotten and the
  // ensemble's request released.
  void Done(HandoffStream* stream);
  // The exit watch's thread: every kCancellationPeriod, whether the server is shutting down; then every engine
  // request still running is cancelled, once.
  void WatchForShutdown();
  // What the metrics need of a request, read from its inputs on arrival.
  void ReadTiming(HandoffStream* stream);
  // Whether the engine repeats the prompt in its output when a request does not say (its exclude_input_in_output
  // parameter, read from its config once it answers).
  bool EngineRepeatsPrompt();

  TRITONSERVER_Server* server_ = nullptr;
  std::string model_name_;
  std::string engine_;
  TRITONSERVER_ResponseAllocator* allocator_ = nullptr;  // the engine's outputs, on the heap (engine_calls.cc)
  std::vector<std::unique_ptr<Sender>> senders_;
  std::atomic<uint64_t> next_stream_{0};
  std::atomic<uint64_t> in_flight_{0};
  std::atomic<bool> stopping_{false};
  std::atomic<bool> exiting_{false};  // the server is shutting down: streams end with kShutdownMessage, new ones refused
  // The streams whose engine request Triton holds (from just before InferAsync until Done), for the exit watch.
  std::mutex live_mutex_;
  std::unordered_set<HandoffStream*> live_;
  std::condition_variable stop_watch_;  // with live_mutex_: stopping_ was set
  std::thread exit_watch_;
  std::vector<uint8_t> token_classes_;  // each token id's TokenTextClass (handoff.cc), from make repo
  std::unique_ptr<RequestMetrics> metrics_;  // null: no metrics (they could not be created)
  std::mutex engine_config_mutex_;
  int engine_repeats_prompt_ = -1;  // -1: not read yet
};

}  // namespace llama3_relay
