"""preprocessing: thin Triton adapter over bls.text.preprocessing.Preprocessor."""

import json
import sys
from pathlib import Path

# The repository is the artifact: `make repo` copies the library this model imports into this folder, so it
# serves without this project installed. First on the path: the shipped copy wins over any other.
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bls.text.without_torch  # noqa: F401 - first: before anything imports transformers
from bls.contract import PREPROCESSING
from bls.lora_names import parse_adapter_table
from bls.model_parameters import model_parameters, parse_bool
from bls.server_watch import exit_with_server
from bls.text.preprocessing import Preprocessor
from bls.text.tokenizer import TokenizerBundle
from bls.triton_io.requests import check_shipped_files
from bls.triton_io.responses import respond_to_each

MODEL = "preprocessing"


class TritonPythonModel:
    def initialize(self, args):
        exit_with_server(MODEL)  # this stub ends when tritonserver does, however it ends
        check_shipped_files(HERE, MODEL)
        params = model_parameters(json.loads(args["model_config"]))
        max_input_len = params.get("max_input_len")
        self.preprocess = Preprocessor(
            TokenizerBundle.from_dir(HERE / params["tokenizer_dir"]),
            add_special_tokens=parse_bool(params.get("add_special_tokens"), True, "add_special_tokens"),
            max_input_len=int(max_input_len) if max_input_len else None,
            query_special_tokens=params.get("query_special_tokens", "text"),
            lora_adapters=parse_adapter_table(params.get("lora_adapters")),
        )

    def execute(self, requests):
        return respond_to_each(requests, PREPROCESSING, self.preprocess, MODEL)
