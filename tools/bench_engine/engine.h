// The bench engine: a Triton backend serving the `tensorrt_llm` engine contract for benchmarks (tools/bench.py,
// tools/device_bench.sh), with no model: a stream's token after position p is the text cycle's token p % length,
// as embedded_engine/synthetic.py's (the config's `text_cycle` parameter, written from there). One thread
// (step_loop.cc) generates a token for every active stream and sends every stream's response of the step, as
// TensorRT-LLM's executor does from its one response thread; a step takes `step_ms` at least (a GPU's pace) or
// nothing (0: as fast as the thread goes).
//
// Files: backend.cc (Triton's entry points, the config), admission.cc (a request into a Stream, the queue limit),
// step_loop.cc (the step thread), responses.cc (output tensors, sending).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "triton/core/tritonbackend.h"

namespace bench_engine {

struct Settings {
  std::string model_name;
  double step_ms = 0.0;         // least step time; 0: unpaced
  uint32_t max_active = 1;      // max_active_requests: sequences generating at once
  uint32_t max_queued = 0;      // max_queued_requests: sequences that may wait for a slot
  std::vector<int32_t> cycle;   // text_cycle: the tokens every stream generates, in a loop
  std::string thread_name;      // the step thread's name (the bench's CPU accounting finds it by it)
};

// One sequence: what its request asked for, and how far it got. Owned by the step thread once admitted.
struct Stream {
  TRITONBACKEND_ResponseFactory* factory = nullptr;
  int32_t prompt_length = 0;   // input_ids' length: where the text cycle starts
  int32_t output_len = 0;      // request_output_len
  int32_t end_id = -1;         // -1: none
  bool streaming = false;      // one response per token; else one response with the whole output
  bool send_output_ids = false;        // requested outputs (TensorRT-LLM sends only those)
  bool send_sequence_length = false;
  int32_t generated = 0;
  std::vector<int32_t> tokens;  // not streaming: the output so far, sent at the end
};

// A Triton error's message (and the error released); "" for none.
std::string Failure(TRITONSERVER_Error* error);
// Logs a failed call of what no one waits on (a release, statistics), naming it.
void LogFailure(TRITONSERVER_Error* error, const char* what);
void Log(TRITONSERVER_LogLevel level, const std::string& message);
uint64_t NowNs();

// admission.cc: the request's inputs into `stream`; "" or what is wrong, with the Triton code to answer it with.
std::string ReadRequest(TRITONBACKEND_Request* request, Stream* stream, TRITONSERVER_Error_Code* code);

// responses.cc: one response of `count` tokens (output_ids [1, 1, count], sequence_length [[count]], those the
// request asked for) with `flags`; "" or why it could not be sent.
std::string SendTokens(const Stream& stream, const int32_t* tokens, uint32_t count, uint32_t flags);
// The stream's last response: an error (final).
void SendError(TRITONBACKEND_ResponseFactory* factory, TRITONSERVER_Error_Code code, const std::string& message);

class Engine {
 public:
  explicit Engine(Settings settings);
  ~Engine();  // stops the step thread, which ends every stream still held (UNAVAILABLE)
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Takes each request (its response factory) into the queue, or refuses it at once; releases every request.
  void Admit(TRITONBACKEND_ModelInstance* instance, TRITONBACKEND_Request** requests, uint32_t count);

 private:
  void Run();  // the step thread
  // One step over `active`: a token for each stream, its response sent; the finished ones removed, counted.
  size_t Step(std::vector<std::unique_ptr<Stream>>* active);
  // The token a stream generates next, and whether the stream ended with it (sent, the factory deleted).
  bool Advance(Stream* stream);

  const Settings settings_;
  std::mutex mutex_;  // guards waiting_, held_, stopping_
  std::condition_variable wake_;
  std::deque<std::unique_ptr<Stream>> waiting_;  // admitted, not yet taken by the step thread
  size_t held_ = 0;  // streams admitted and not finished (active + waiting): the queue limit counts them
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace bench_engine
