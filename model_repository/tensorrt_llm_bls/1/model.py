"""tensorrt_llm_bls: thin Triton adapter over bls.generation.generator.

How requests arrive, responses leave and the engines are reached is the transport's (bls.transports), chosen once
at load from the `transport` parameter `make repo` writes for the repository's topology (engine_build/topology.py):
"relay" (streaming: this model runs behind the C++ model tensorrt_llm_bls, under the name tensorrt_llm_bls_python)
or "in_process" (unary: this model is tensorrt_llm_bls).
"""

import json
import sys
from functools import partial
from pathlib import Path

import triton_python_backend_utils as pb_utils

# The repository is the artifact: `make repo` copies the library this model imports into this folder, so it
# serves without this project installed. First on the path: the shipped copy wins over any other.
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bls.text.without_torch  # noqa: F401 - first: before anything imports transformers
from bls.contract import BLS_MODEL, TENSORRT_LLM_BLS
from bls.generation.generator import (
    BlsConfig,
    GenerationObserver,
    TextGenerator,
    TextRequest,
)
from bls.llm_metrics import GenerationMetrics, RequestTiming
from bls.model_parameters import model_parameters, parse_bool, parse_positive_int
from bls.response_loop import merge_streamed
from bls.server_watch import exit_with_server
from bls.text.tokenizer import TokenizerBundle
from bls.transports import InProcessTransport, RelayTransport
from bls.triton_io.lock import PB_LOCK
from bls.triton_io.metrics import Metrics
from bls.triton_io.requests import check_shipped_files

MODEL = BLS_MODEL  # what clients call, with or without the relay: the name in logs and metrics
# How long finalize waits for running requests before ending them with an error. Triton calls finalize with
# requests in flight only when it gives up waiting for them (server shutdown past --exit-timeout-secs): an
# unload through the repository API waits until every response sender is released.
UNLOAD_WAIT_S = 10.0


class TritonPythonModel:
    def initialize(self, args):
        exit_with_server(MODEL)  # this stub ends when tritonserver does, however it ends
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
        transport = params.get("transport", "")
        self.metrics = Metrics(lock=PB_LOCK)
        if transport == "relay":
            if not self.config.decoupled:
                raise ValueError(f"{MODEL}: transport relay needs a decoupled model (make repo DECOUPLED=true)")
            self.transport = RelayTransport(
                MODEL, TENSORRT_LLM_BLS, workers=parse_positive_int(params.get("max_concurrent_requests"), 256,
                                                                    "max_concurrent_requests"),
                queued=parse_positive_int(params.get("max_queued_requests"), 256, "max_queued_requests"),
                merge=partial(merge_streamed, accumulate=self.config.accumulate_tokens))
        elif transport == "in_process":
            if self.config.decoupled:
                raise ValueError(f"{MODEL}: a decoupled (streaming) model is served through the relay "
                                 "(transport relay); in_process is for unary repositories (make repo DECOUPLED=false)")
            self.transport = InProcessTransport(MODEL, TENSORRT_LLM_BLS)
        else:
            raise ValueError(f"{MODEL}: model parameter transport={transport!r} is neither relay nor in_process")
        pb_utils.Logger.log_info(f"{MODEL}: {transport} transport")
        self.generator = TextGenerator(
            self.config, self.transport.models, TokenizerBundle.from_dir(HERE / params["tokenizer_dir"]),
            self._observer(), row_pool=self.transport.row_pool,
        )

    def _observer(self) -> GenerationObserver:
        labels = {"model": MODEL}
        generations = GenerationMetrics(self.metrics, MODEL)
        draft_tokens = self.metrics.counter("llm_bls_draft_tokens_total", "Draft tokens proposed", labels)
        accepted = self.metrics.counter("llm_bls_accepted_draft_tokens_total", "Draft tokens accepted", labels)

        def on_finished(result):
            generations.finished(RequestTiming(
                prompt_tokens=result.num_input_tokens, generated_tokens=len(result.token_ids),
                finish_reason=result.finish_reason, end_s=result.end_s, first_token_s=result.first_token_s,
                last_token_s=result.last_token_s, first_response_tokens=result.first_response_tokens))
            if result.speculation is not None:
                draft_tokens.increment(result.speculation.draft_tokens)
                accepted.increment(result.speculation.accepted_tokens)

        return GenerationObserver(on_started=generations.started, on_first_token=generations.first_token,
                                  on_finished=on_finished)

    def execute(self, requests):
        self.transport.execute(requests, self._serve)
        return None

    def _serve(self, inputs, request_id, sink, arrived):
        self.generator.generate(TextRequest.from_inputs(inputs, self.config, request_id), sink, arrived)

    def finalize(self):
        """Every queued and running request gets a final response (running ones up to UNLOAD_WAIT_S to
        finish), and no engine generation is left running."""
        for warning in self.transport.close(UNLOAD_WAIT_S):
            pb_utils.Logger.log_warn(f"{MODEL}: {warning}")
        self.metrics.close()
