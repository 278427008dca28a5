"""The frames the Python BLS writes to the relay, byte for byte as relay/relay.cc's header comment lays them out
(the relay's reading of them is proven by the integration tests, which all stream through it)."""

import struct

import numpy as np
import pytest

from bls.relay import RelayedRequest, encode_outputs, error_frame, response_frame


def test_a_response_frame_is_laid_out_as_the_relay_reads_it():
    outputs = {"text_output": np.array(["hé".encode(), b""], dtype=object),
               "num_output_tokens": np.array([[7]], dtype=np.int32)}
    frame = response_frame(42, encode_outputs(outputs), final=True)
    text = struct.pack("<I", 3) + "hé".encode() + struct.pack("<I", 0)
    expected_body = (struct.pack("<QBH", 42, 1, 2)
                     + struct.pack("<H11sBBqQ", 11, b"text_output", 13, 1, 2, len(text)) + text
                     + struct.pack("<H17sBBqqQ", 17, b"num_output_tokens", 8, 2, 1, 1, 4) + struct.pack("<i", 7))
    assert frame == struct.pack("<I", len(expected_body)) + expected_body


def test_a_streamed_response_is_not_final_and_strings_are_utf8():
    frame = response_frame(1, encode_outputs({"text_output": np.array(["ü"], dtype=object)}), final=False)
    assert frame[12] == 0  # kind: a response
    assert frame.endswith(struct.pack("<I", 2) + "ü".encode())


def test_an_error_frame_carries_the_code_and_the_message():
    frame = error_frame(9, 3, "max_tokens: is required")
    body = struct.pack("<QBI", 9, 2, 3) + b"max_tokens: is required"
    assert frame == struct.pack("<I", len(body)) + body


def test_every_numeric_output_keeps_its_datatype_and_values():
    for dtype, code in ((np.bool_, 1), (np.int32, 8), (np.int64, 9), (np.float32, 11), (np.float64, 12)):
        array = np.arange(6).reshape(2, 3).astype(dtype)
        encoded = encode_outputs({"x": array})
        assert encoded[5] == code and encoded.endswith(array.tobytes())
    with pytest.raises(TypeError, match="output x: no Triton datatype"):
        encode_outputs({"x": np.array([1 + 2j])})


def test_only_requests_from_the_relay_are_relayed():
    assert RelayedRequest.from_parameters({}) is None
    assert RelayedRequest.from_parameters({"llama3_relay_stream": 5}) is None
    assert RelayedRequest.from_parameters({"llama3_relay_stream": 5, "llama3_relay_socket": "s"}) == RelayedRequest("s", 5)
