"""postprocessing: thin Triton adapter over bls.text.postprocessing.Postprocessor."""

import json

from bls.contract import POSTPROCESSING
from bls.text.postprocessing import Postprocessor
from bls.text.tokenizer import TokenizerBundle
from bls.triton_io import model_parameters, parse_bool, respond_to_each

MODEL = "postprocessing"


class TritonPythonModel:
    def initialize(self, args):
        params = model_parameters(json.loads(args["model_config"]))
        self.postprocess = Postprocessor(
            TokenizerBundle.from_dir(params["tokenizer_dir"]),
            skip_special_tokens=parse_bool(params.get("skip_special_tokens"), True, "skip_special_tokens"),
        )

    def execute(self, requests):
        return respond_to_each(requests, POSTPROCESSING, self.postprocess, MODEL)
