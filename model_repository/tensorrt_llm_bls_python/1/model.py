"""tensorrt_llm_bls_python: thin Triton adapter over bls.generation.generator; tensorrt_llm_bls itself when the
repository has no relay (make repo RELAY=off, or DECOUPLED=false).

With the relay (relay/relay.cc, the C++ model named tensorrt_llm_bls), requests come from it and their responses
go back to it as frames (bls.relay.RelayedSender); requests sent to this model directly are answered through
the stub as always.

Each request is served on a worker thread of a bounded pool (bls.request_pool): one instance serves many
requests, refuses what is beyond its capacity with UNAVAILABLE, and answers everyone when it unloads.
One thread sends every response (bls.response_loop), merging a stream's text while it waits to go out.
"""

import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Callable

import triton_python_backend_utils as pb_utils

# The repository is the artifact: `make repo` copies the library this model imports into this folder, so it
# serves without this project installed. First on the path: the shipped copy wins over any other.
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bls.text.without_torch  # noqa: E402,F401 - first: before anything imports transformers
from bls.contract import TENSORRT_LLM_BLS  # noqa: E402
from bls.engine_streams import EngineStreams, endpoints, open_files_warning  # noqa: E402
from bls.finish_reason import REPORTED_FINISH_REASONS  # noqa: E402
from bls.generation.generator import (  # noqa: E402
    BlsConfig, GenerationObserver, TextGenerator, TextRequest, merge_streamed,
)
from bls.relay import RelayConnections, RelayedRequest  # noqa: E402
from bls.request_pool import RequestPool  # noqa: E402
from bls.response_loop import ResponseLoop  # noqa: E402
from bls.text.tokenizer import TokenizerBundle  # noqa: E402
from bls.triton_io import (  # noqa: E402
    PB_LOCK, ChildModels, Metrics, RelayedSender, SafeSender, check_shipped_files, model_parameters, parse_bool,
    parse_positive_int, read_inputs, request_parameters,
)

MODEL = "tensorrt_llm_bls"  # what clients call, with or without the relay: the name in logs and metrics
# How long finalize waits for running requests before ending them with an error. Triton calls finalize with
# requests in flight only when it gives up waiting for them (server shutdown past --exit-timeout-secs): an
# unload through the repository API waits until every response sender is released.
UNLOAD_WAIT_S = 10.0
# Threads that send what this instance's other threads queue (bls.response_loop: the thread that reads the engine's
# responses, from the relay's connection or the HTTP streams, carries most streamed tokens and sends its own; gRPC
# engine streams, speculative decoding rounds and final responses come from other threads). Sends are serialised (PB_LOCK), but each
# is a round trip to tritonserver after which the thread must win the GIL back from the streams' threads:
# with one thread that wait was most of a send under load (soak, 256 clients on 2 cores: 0.8 s between a
# stream's responses); with four, one sends while the others wait for the GIL (0.15 s).
SENDING_THREADS = 4
FIRST_TOKEN_BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0]


class TritonPythonModel:
    def initialize(self, args):
        check_shipped_files(HERE, MODEL)
        model_config = json.loads(args["model_config"])
        params = model_parameters(model_config)
        self.config = BlsConfig(
            engine_model=params.get("tensorrt_llm_model_name", "tensorrt_llm"),
            preprocessing_model=params.get("preprocessing_model_name", "preprocessing"),
            postprocessing_model=params.get("postprocessing_model_name", "postprocessing"),
            draft_model=params.get("tensorrt_llm_draft_model_name") or None,
            max_draft_len=int(params.get("max_draft_len", "0")),
            accumulate_tokens=parse_bool(params.get("accumulate_tokens"), False, "accumulate_tokens"),
            stream_interval=parse_positive_int(params.get("stream_interval"), 1, "stream_interval"),
            skip_special_tokens=parse_bool(params.get("skip_special_tokens"), True, "skip_special_tokens"),
            # The engine's parameter, rendered here too (unset: false, as the engine's own default).
            exclude_input_in_output=parse_bool(params.get("exclude_input_in_output"), False,
                                               "exclude_input_in_output"),
            # One setting for the repository (upstream's decoupled_mode): the engines are decoupled when we are.
            decoupled=pb_utils.using_decoupled_model_transaction_policy(model_config),
        )
        workers = int(params.get("max_concurrent_requests", "256"))
        self.requests = RequestPool(workers, int(params.get("max_queued_requests", "256")), "bls")
        self.responses = ResponseLoop(threads=SENDING_THREADS)
        # Engine responses read from a relay connection are sent like an HTTP sweep's (bls.relay).
        self.relays = RelayConnections(after_sweep=self._send_waiting)
        self.merge = partial(merge_streamed, accumulate=self.config.accumulate_tokens)
        self.engine_streams = (self._engine_streams(params, workers * _instances(model_config), self._send_waiting)
                               if self.config.decoupled else None)
        self.generator = TextGenerator(
            self.config, ChildModels(self.engine_streams),
            TokenizerBundle.from_dir(HERE / params["tokenizer_dir"]), self._observer(),
            row_pool=ThreadPoolExecutor(max_workers=workers, thread_name_prefix="bls-row"),
        )

    @staticmethod
    def _engine_streams(params, max_streams: int, send_waiting: Callable[[], None]) -> EngineStreams:
        """Engine streams go through this server's own endpoints (bls/engine_streams.py says why); the stub's
        parent process is tritonserver. `max_streams`: how many all instances of this model may hold at once.
        `send_waiting`: the HTTP reader sends what each sweep of engine events queued (bls/response_loop.py)."""
        server_pid = os.getppid()
        streams = EngineStreams(*endpoints(params.get("engine_grpc_url", ""), params.get("engine_http_url", ""),
                                           server_pid), after_http_sweep=send_waiting)
        pb_utils.Logger.log_info(f"{MODEL}: engine requests stream through tritonserver's HTTP generate_stream at "
                                 f"{streams.http_url or '(HTTP disabled)'} and gRPC at {streams.grpc_url} (requests "
                                 "HTTP cannot carry exactly)")
        warning = open_files_warning(Path(f"/proc/{server_pid}/limits").read_text(), max_streams)
        if warning:
            pb_utils.Logger.log_warn(f"{MODEL}: {warning}")
        return streams

    def _send_waiting(self) -> None:
        """What a sweep of engine events queued goes out, its frames to the relay in one write (bls.relay)."""
        with self.relays.corked():
            self.responses.send_waiting()

    def _observer(self) -> GenerationObserver:
        self.metrics = Metrics(lock=PB_LOCK)
        labels = {"model": MODEL}
        first_token = self.metrics.histogram(
            "llm_bls_time_to_first_token_seconds", "Time from request arrival to the first generated token",
            labels, FIRST_TOKEN_BUCKETS)
        output_tokens = self.metrics.counter("llm_bls_output_tokens_total", "Generated tokens", labels)
        draft_tokens = self.metrics.counter("llm_bls_draft_tokens_total", "Draft tokens proposed", labels)
        accepted = self.metrics.counter("llm_bls_accepted_draft_tokens_total", "Draft tokens accepted", labels)
        finished = {
            reason: self.metrics.counter("llm_bls_requests_total", "Finished generations by finish reason",
                                         {**labels, "finish_reason": reason.value})
            for reason in REPORTED_FINISH_REASONS
        }

        def on_finished(result):
            output_tokens.increment(len(result.token_ids))
            finished[result.finish_reason.reported].increment()
            if result.speculation is not None:
                draft_tokens.increment(result.speculation.draft_tokens)
                accepted.increment(result.speculation.accepted_tokens)

        return GenerationObserver(on_first_token=first_token.observe, on_finished=on_finished)

    def execute(self, requests):
        arrived = time.monotonic()
        for request in requests:
            sender = self.responses.open(self._transport(request), self.merge)
            self.requests.submit(lambda r=request, s=sender: self._serve(r, s, arrived), sender.send_error)
        return None

    def _transport(self, request) -> SafeSender:
        with PB_LOCK:
            relayed = RelayedRequest.from_parameters(request_parameters(request))
        if relayed is None:
            return SafeSender(request, MODEL)
        connection = self.relays.get(relayed.socket_name)
        if self.engine_streams is not None:
            self.engine_streams.use_relay(connection)  # its engine streams too, from now on (bls.engine_streams)
        return RelayedSender(request, MODEL, relayed, connection)

    def _serve(self, request, sender, arrived):
        try:
            with PB_LOCK:  # pb_utils calls, on a worker thread
                inputs = read_inputs(request, TENSORRT_LLM_BLS)
                request_id = request.request_id()
            request = TextRequest.from_inputs(inputs, self.config, request_id)
            sender.when_cancelled(lambda: self.generator.cancel(request.request_id))
            self.generator.generate(request, sender, arrived)
        except Exception as error:  # noqa: BLE001 - every failure becomes this request's error, never the server's
            sender.send_error(error)

    def finalize(self):
        """Every queued and running request gets a final response (running ones up to UNLOAD_WAIT_S to
        finish), and no engine generation is left running."""
        cut_short = self.requests.shutdown(UNLOAD_WAIT_S, self.generator.stop_running_engines)
        if cut_short:
            pb_utils.Logger.log_warn(f"{MODEL}: unloading ended {cut_short} requests with an error")
        if not self.responses.close(UNLOAD_WAIT_S):
            pb_utils.Logger.log_warn(f"{MODEL}: unloading before every response was sent")
        self.metrics.close()
        self.relays.close()


def _instances(model_config) -> int:
    """Instances of this model in the server (config.pbtxt instance_group)."""
    return sum(int(group.get("count", 1)) for group in model_config.get("instance_group", [])) or 1
