"""Bench-only: streams `n` responses of one or two small output tensors (see config.pbtxt)."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:  # one request at a time: the stub does nothing else while it sends
            count = int(pb_utils.get_input_tensor_by_name(request, "n").as_numpy()[0])
            tensors = int(pb_utils.get_input_tensor_by_name(request, "tensors").as_numpy()[0])
            sender = request.get_response_sender()
            text = np.array([b"tok"], dtype=object)
            for index in range(count):
                outputs = [pb_utils.Tensor("text_output", text)]
                if tensors == 2:
                    outputs.append(pb_utils.Tensor("num_output_tokens", np.array([[index + 1]], np.int32)))
                sender.send(pb_utils.InferenceResponse(output_tensors=outputs))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
