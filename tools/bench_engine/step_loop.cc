// The step thread: every step, a token for each active stream and that stream's response, all sent from this one
// thread, as TensorRT-LLM's executor sends a step's responses from its one response thread. Streams wait in
// admission order for one of max_active slots; a stream whose client cancelled it
// (TRITONBACKEND_ResponseFactoryIsCancelled: Triton's request cancellation, e.g. a client gone) ends at its next
// step with the final flag alone, as TensorRT-LLM ends a cancelled request.
#include <pthread.h>

#include <algorithm>
#include <chrono>

#include "engine.h"

namespace bench_engine {

Engine::Engine(Settings settings) : settings_(std::move(settings)) {
  thread_ = std::thread([this] { Run(); });
  pthread_setname_np(thread_.native_handle(), settings_.thread_name.c_str());
}

Engine::~Engine() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_one();
  thread_.join();
}

bool Engine::Advance(Stream* stream) {
  bool cancelled = false;
  LogFailure(TRITONBACKEND_ResponseFactoryIsCancelled(stream->factory, &cancelled), "cancellation");
  std::string failure;
  bool finished = true;
  if (cancelled) {
    failure = Failure(TRITONBACKEND_ResponseFactorySendFlags(stream->factory, TRITONSERVER_RESPONSE_COMPLETE_FINAL));
  } else {
    const std::vector<int32_t>& cycle = settings_.cycle;
    const int32_t token = cycle[static_cast<size_t>(stream->prompt_length + stream->generated) % cycle.size()];
    if (token == stream->end_id) {  // the end id ends the sequence and is not part of its output
      failure = stream->streaming ? SendTokens(*stream, nullptr, 0, TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                                  : SendTokens(*stream, stream->tokens.data(),
                                               static_cast<uint32_t>(stream->tokens.size()),
                                               TRITONSERVER_RESPONSE_COMPLETE_FINAL);
    } else {
      ++stream->generated;
      finished = stream->generated >= stream->output_len;
      const uint32_t flags = finished ? TRITONSERVER_RESPONSE_COMPLETE_FINAL : 0;
      if (stream->streaming) {
        failure = SendTokens(*stream, &token, 1, flags);
      } else {
        stream->tokens.push_back(token);
        if (finished) {
          failure = SendTokens(*stream, stream->tokens.data(), static_cast<uint32_t>(stream->tokens.size()), flags);
        }
      }
    }
  }
  if (!failure.empty()) {  // nobody can be answered any more on this stream: it ends here
    Log(TRITONSERVER_LOG_ERROR, settings_.model_name + ": a response could not be sent, the stream ends: " + failure);
    finished = true;
  }
  if (finished) LogFailure(TRITONBACKEND_ResponseFactoryDelete(stream->factory), "response factory");
  return finished;
}

size_t Engine::Step(std::vector<std::unique_ptr<Stream>>* active) {
  size_t kept = 0;
  for (std::unique_ptr<Stream>& stream : *active) {
    if (!Advance(stream.get())) (*active)[kept++] = std::move(stream);
  }
  const size_t finished = active->size() - kept;
  active->resize(kept);
  return finished;
}

void Engine::Run() {
  using Clock = std::chrono::steady_clock;
  const auto step = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double, std::milli>(settings_.step_ms));
  std::vector<std::unique_ptr<Stream>> active;
  Clock::time_point next_step = Clock::now();
  size_t finished = 0;
  while (true) {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      held_ -= finished;
      if (active.empty() && waiting_.empty() && !stopping_) {
        wake_.wait(lock, [this] { return stopping_ || !waiting_.empty(); });
        next_step = Clock::now();  // an idle engine starts its next step at once
      }
      if (stopping_) break;
      while (active.size() < settings_.max_active && !waiting_.empty()) {
        active.push_back(std::move(waiting_.front()));
        waiting_.pop_front();
      }
    }
    finished = Step(&active);
    if (step.count() > 0) {  // paced: the next step starts a step time after this one did, never earlier
      next_step = std::max(next_step + step, Clock::now());
      std::this_thread::sleep_until(next_step);
    }
  }
  // Unloading: every stream still held ends with UNAVAILABLE (retry, elsewhere or after the reload).
  std::lock_guard<std::mutex> lock(mutex_);
  for (std::unique_ptr<Stream>& stream : waiting_) active.push_back(std::move(stream));
  waiting_.clear();
  for (std::unique_ptr<Stream>& stream : active) {
    SendError(stream->factory, TRITONSERVER_ERROR_UNAVAILABLE, settings_.model_name + ": unloading");
    LogFailure(TRITONBACKEND_ResponseFactoryDelete(stream->factory), "response factory");
  }
  held_ = 0;
}

}  // namespace bench_engine
