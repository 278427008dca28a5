"""preprocessing: thin Triton adapter over bls.preprocessing.Preprocessor."""

import json

from bls.contract import PREPROCESSING
from bls.preprocessing import Preprocessor
from bls.tokenization import TokenizerBundle
from bls.triton_io import error_response, make_response, model_parameters, parse_bool, read_inputs

MODEL = "preprocessing"


class TritonPythonModel:
    def initialize(self, args):
        params = model_parameters(json.loads(args["model_config"]))
        max_input_len = params.get("max_input_len")
        self.preprocess = Preprocessor(
            TokenizerBundle.from_dir(params["tokenizer_dir"]),
            add_special_tokens=parse_bool(params.get("add_special_tokens"), True, "add_special_tokens"),
            max_input_len=int(max_input_len) if max_input_len else None,
            query_special_tokens=params.get("query_special_tokens", "text"),
        )

    def execute(self, requests):
        responses = []
        for request in requests:
            try:
                responses.append(make_response(self.preprocess(read_inputs(request, PREPROCESSING))))
            except Exception as error:  # noqa: BLE001 - one bad request must not fail the batch
                responses.append(error_response(error, MODEL))
        return responses
