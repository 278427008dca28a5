"""tensorrt_llm on TensorRT-LLM's LLM API (Python backend): a thin adapter over llmapi_engine.

At load: the `llm` parameter picks the LLM API (llmapi_engine.llm_api: TensorRT-LLM, or the stand-in; never a
fallback), model.yaml gives the LLM() arguments (llmapi_engine.model_config), and one LLM starts on its own asyncio
loop (llmapi_engine.runner). Each request is read through bls.contract.TENSORRT_LLM_LLMAPI, mapped to LLM requests
(llmapi_engine.request_mapping: the C++ backend's contract, or NVIDIA's llmapi names) and answered from the LLM's
outputs (llmapi_engine.responses). Decoupled: one response per generated step when streaming; otherwise, as the
tensorrtllm backend, streaming and batch > 1 are refused. The engine's nv_trt_llm_* families come from the LLM's
iteration stats (llmapi_engine.metrics).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import triton_python_backend_utils as pb_utils

# The repository is the artifact: `make repo` copies the library this model imports into this folder, so it
# serves without this project installed. First on the path: the shipped copy wins over any other.
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bls.contract import TENSORRT_LLM_LLMAPI
from bls.errors import InvalidRequest
from bls.model_parameters import model_parameters, parse_bool
from bls.server_watch import exit_with_server
from bls.text.tokenizer import TokenizerBundle
from bls.triton_io.metrics import Metrics
from bls.triton_io.requests import check_shipped_files, read_inputs
from bls.triton_io.responses import error_response, make_response
from bls.triton_io.senders import StubSender
from embedded_engine.responses import CollectingSender
from llmapi_engine.llm_api import load_llm_api
from llmapi_engine.metrics import LlmApiMetrics
from llmapi_engine.model_config import read_model_config
from llmapi_engine.request_mapping import is_stop_request, map_request
from llmapi_engine.runner import LlmRunner

# How long unloading waits for running requests before shutting the LLM down (which ends them with an error).
UNLOAD_WAIT_S = 10.0


class TritonPythonModel:
    def initialize(self, args: dict[str, Any]) -> None:
        exit_with_server(args["model_name"])  # this stub ends when tritonserver does, however it ends
        config = json.loads(args["model_config"])
        params = model_parameters(config)
        self._name = args["model_name"]
        check_shipped_files(HERE, self._name)
        self._decoupled = pb_utils.using_decoupled_model_transaction_policy(config)
        self._exclude_input = parse_bool(params.get("exclude_input_in_output"), False, "exclude_input_in_output")
        api = load_llm_api(params.get("llm", ""))
        llm_config = read_model_config(HERE)
        if llm_config.decoupled != self._decoupled:
            raise ValueError(f"model.yaml triton_config.decoupled is {llm_config.decoupled}, config.pbtxt's "
                             f"transaction policy {self._decoupled}: they must agree")
        self._tokenizer = TokenizerBundle.from_dir(llm_config.tokenizer_dir)
        self._max_seq_len = llm_config.max_seq_len()
        self._lora_adapters = llm_config.lora_adapters()
        self._metrics = Metrics()
        self._llm_metrics = LlmApiMetrics(self._metrics, self._name, args["model_version"])
        self._runner = LlmRunner(api, llm_config, self._tokenizer, on_stats=self._llm_metrics.on_stats,
                                 on_finished=self._llm_metrics.request_finished)
        pb_utils.Logger.log_info(f"{self._name}: LLM API {api.name} started")

    def execute(self, requests: list[Any]) -> list[Any] | None:
        if self._decoupled:
            for request in requests:
                sender = StubSender(request, self._name)
                self._submit(request, sender, sender.is_cancelled)
            return None
        collectors = []
        for request in requests:
            collector = CollectingSender()
            self._submit(request, collector, lambda c=collector, r=request: c.is_cancelled() or r.is_cancelled())
            collectors.append(collector)
        responses = []
        for collector in collectors:
            collector.wait()
            if collector.error is not None:
                responses.append(error_response(collector.error, self._name))
            else:
                responses.append(make_response(collector.outputs or {}))
        return responses

    def _submit(self, request: Any, sender: Any, is_cancelled: Any) -> None:
        """Map and start one Triton request; every failure ends its stream with an error response."""
        try:
            inputs = read_inputs(request, TENSORRT_LLM_LLMAPI)
            if is_stop_request(inputs):
                if not request.request_id():
                    raise InvalidRequest("stop", "needs the Triton request id of the request to stop")
                self._runner.stop(request.request_id())
                sender.finish()
                return
            llm_requests = map_request(inputs, self._tokenizer, self._tokenizer.vocab_size, self._max_seq_len,
                                       self._exclude_input, self._lora_adapters)
            if not self._decoupled:
                if any(r.streaming for r in llm_requests):
                    raise InvalidRequest("streaming", "needs the model deployed with a decoupled transaction policy")
                if len(llm_requests) > 1:
                    raise InvalidRequest("input_ids", "batch size > 1 needs a decoupled transaction policy")
            self._runner.submit(request.request_id(), llm_requests, sender, is_cancelled)
        except Exception as error:  # noqa: BLE001 - every failure becomes this request's error, never the server's
            sender.send_error(error)

    def finalize(self) -> None:
        if not self._runner.drain(UNLOAD_WAIT_S):
            pb_utils.Logger.log_warn(f"{self._name}: unloading with requests still running after {UNLOAD_WAIT_S} s; "
                                     "they end with an error")
        self._runner.shutdown()
        self._metrics.close()
