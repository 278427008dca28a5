"""Bench-only: what recording the request and engine metrics costs this stub (see config.pbtxt).

The production classes, with one difference: the hand-over to tritonserver (Metrics.flush_due, every FLUSH_S) runs
on this thread instead of the flush thread, so that all of it, the round trips included, is done when a phase
answers."""

import time

import numpy as np
import triton_python_backend_utils as pb_utils

from bls.finish_reason import FinishReason
from bls.llm_metrics import GenerationMetrics, RequestTiming
from bls.triton_io.metrics import Metrics
from embedded_engine.metrics import BackendMetrics
from embedded_engine.scheduler import IterationStats

TOKENS = 128  # per request: the figures are per request; the harness divides


class TritonPythonModel:
    def initialize(self, args):
        self.metrics = Metrics(flush_thread=False)
        self.requests = GenerationMetrics(self.metrics, "metrics_cost")
        self.engine = BackendMetrics(self.metrics, "metrics_cost", "1")

    def execute(self, requests):
        responses = []
        for request in requests:
            phase = int(pb_utils.get_input_tensor_by_name(request, "phase").as_numpy()[0])
            count = int(pb_utils.get_input_tensor_by_name(request, "count").as_numpy()[0])
            started = time.process_time()
            for index in range(count):
                if phase == 0:  # one finished BLS request, and its engine request
                    self.requests.first_token(0.05)
                    self.requests.finished(RequestTiming(100, TOKENS, FinishReason.LENGTH, 2.0, first_token_s=0.05,
                                                         last_token_s=1.9, first_response_tokens=1))
                    self.engine.request_finished(100, TOKENS)
                    continue
                if phase == 1:  # one engine iteration of 16 sequences
                    self.engine.update(IterationStats(
                        iteration=index, timestamp_ns=time.time_ns(), active=16, max_active=16, scheduled=16,
                        context=1, waiting=3, context_tokens=100, kv_blocks_used=40, kv_blocks_max=2048,
                        kv_blocks_reused=0))
                # phase 2: phase 1's loop without the metrics (the baseline)
                self.metrics.flush_due()
                time.sleep(0.0005)  # iterations come apart, as an engine's steps do
            time.sleep(Metrics.FLUSH_S)
            self.metrics.flush_due()  # what is left, handed over now
            spent = time.process_time() - started
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("stub_cpu_s", np.array([spent]))]))
        return responses

    def finalize(self):
        self.metrics.close()
