"""postprocessing: thin Triton adapter over bls.text.postprocessing.Postprocessor.

In the ensemble it runs once per engine response (a streamed token) per stream; the dynamic batcher hands an
instance every stream's waiting requests, which are decoded together (Postprocessor.decode_each).
"""

import json
import sys
from pathlib import Path

# The repository is the artifact: `make repo` copies the library this model imports into this folder, so it
# serves without this project installed. First on the path: the shipped copy wins over any other.
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bls.text.without_torch  # noqa: F401 - first: before anything imports transformers
from bls.contract import POSTPROCESSING
from bls.model_parameters import model_parameters, parse_bool
from bls.server_watch import exit_with_server
from bls.text.postprocessing import Postprocessor
from bls.text.tokenizer import TokenizerBundle
from bls.triton_io.requests import check_shipped_files, read_inputs
from bls.triton_io.responses import error_response, make_response

MODEL = "postprocessing"


class TritonPythonModel:
    def initialize(self, args):
        exit_with_server(MODEL)  # this stub ends when tritonserver does, however it ends
        check_shipped_files(HERE, MODEL)
        params = model_parameters(json.loads(args["model_config"]))
        self.postprocess = Postprocessor(
            TokenizerBundle.from_dir(HERE / params["tokenizer_dir"]),
            skip_special_tokens=parse_bool(params.get("skip_special_tokens"), True, "skip_special_tokens"),
        )

    def execute(self, requests):
        """One response per request, in order; a bad request fails alone, not its batch."""
        results = [None] * len(requests)
        readable, inputs = [], []
        for index, request in enumerate(requests):
            try:
                inputs.append(read_inputs(request, POSTPROCESSING))
                readable.append(index)
            except Exception as error:  # noqa: BLE001 - becomes this request's error response
                results[index] = error
        try:
            decoded = self.postprocess.decode_each(inputs)
        except Exception as error:  # noqa: BLE001 - unexpected: every request of the batch gets it
            decoded = [error] * len(inputs)
        for index, result in zip(readable, decoded, strict=True):
            results[index] = result
        return [error_response(result, MODEL) if isinstance(result, Exception) else make_response(result)
                for result in results]
