"""preprocessing: thin Triton adapter over bls.text.preprocessing.Preprocessor."""

import json

from bls.contract import PREPROCESSING
from bls.text.preprocessing import Preprocessor
from bls.text.tokenizer import TokenizerBundle
from bls.triton_io import model_parameters, parse_bool, respond_to_each

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
        return respond_to_each(requests, PREPROCESSING, self.preprocess, MODEL)
