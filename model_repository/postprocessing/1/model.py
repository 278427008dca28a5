"""postprocessing: thin Triton adapter over bls.postprocessing.Postprocessor."""

import json

from bls.contract import POSTPROCESSING
from bls.postprocessing import Postprocessor
from bls.tokenization import TokenizerBundle
from bls.triton_io import error_response, make_response, model_parameters, parse_bool, read_inputs

MODEL = "postprocessing"


class TritonPythonModel:
    def initialize(self, args):
        params = model_parameters(json.loads(args["model_config"]))
        self.postprocess = Postprocessor(
            TokenizerBundle.from_dir(params["tokenizer_dir"]),
            skip_special_tokens=parse_bool(params.get("skip_special_tokens"), True, "skip_special_tokens"),
        )

    def execute(self, requests):
        responses = []
        for request in requests:
            try:
                responses.append(make_response(self.postprocess(read_inputs(request, POSTPROCESSING))))
            except Exception as error:  # noqa: BLE001 - one bad request must not fail the batch
                responses.append(error_response(error, MODEL))
        return responses
