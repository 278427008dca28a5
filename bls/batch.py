"""Per-row access to the input tensors of one batched Triton request: the one place that knows how a
request's rows are laid out.

With `max_batch_size > 0` every input arrives batch-first: scalars as [batch, 1] (or [batch] where the
config reshapes [1] to []), lists as [batch, N]. A value given once ([1] or [1, ...]) applies to every row.
Every problem is an InvalidRequest naming the input. Every floating-point input is finite: NaN and infinities are
refused when the request is read (every model that takes floats reads its request through BatchInputs), so no
sampler, penalty or bias ever computes with them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from bls.errors import InvalidRequest


class BatchInputs:
    def __init__(self, inputs: Mapping[str, np.ndarray], batch_size: int):
        for name, value in inputs.items():
            refuse_non_finite(name, value)
        self._inputs = inputs
        self.batch_size = batch_size

    def has(self, name: str) -> bool:
        return name in self._inputs

    def scalar(self, name: str, row: int, convert: Callable[[Any], Any], default: Any = None) -> Any:
        """The one value of `name` for `row` ([batch], [batch, 1], or one value for the whole batch)."""
        if name not in self._inputs:
            return default
        array = np.asarray(self._inputs[name])
        if array.ndim > 2 or (array.ndim == 2 and array.shape[1] != 1):
            raise InvalidRequest(name, f"must hold one value per batch item, got shape {list(array.shape)}")
        flat = array.reshape(-1)
        if flat.size == self.batch_size:
            return convert(flat[row])
        if flat.size == 1:  # one value for the whole batch
            return convert(flat[0])
        raise InvalidRequest(name, f"has {flat.size} values for a batch of {self.batch_size}")

    def uniform_scalar(self, name: str, convert: Callable[[Any], Any], default: Any = None) -> Any:
        """A value that must be the same for every row (e.g. `stream`: one response stream per request)."""
        if name not in self._inputs:
            return default
        values = np.unique(np.asarray(self._inputs[name]).reshape(-1))
        if values.size != 1:
            raise InvalidRequest(name, "must be the same for every row of a batch")
        return convert(values[0])

    def item(self, name: str, row: int, item_ndim: int) -> np.ndarray | None:
        """Row `row` of a batched tensor whose items have `item_ndim` dimensions."""
        if name not in self._inputs:
            return None
        array = np.asarray(self._inputs[name])
        if array.ndim == item_ndim:  # unbatched, accepted for a single item
            array = array[np.newaxis]
        if array.ndim != item_ndim + 1:
            raise InvalidRequest(name, f"has {array.ndim} dimensions, expected {item_ndim + 1} (batch first)")
        if array.shape[0] == self.batch_size:
            return array[row]
        if array.shape[0] == 1:
            return array[0]
        raise InvalidRequest(name, f"has batch size {array.shape[0]}, the request has {self.batch_size}")

    def values(self, name: str, row: int) -> np.ndarray:
        """Every value of a [batch, N] input for `row`, flattened."""
        return np.asarray(self._inputs[name]).reshape(self.batch_size, -1)[row]

    def texts(self, name: str, row: int) -> list[str]:
        """Every string of a [batch, N] BYTES input for `row`; [] when the input is absent."""
        if name not in self._inputs:
            return []
        return [decode_utf8(value, name) for value in self.values(name, row)]

    def text(self, name: str, row: int) -> str:
        texts = self.texts(name, row)
        if len(texts) != 1:
            raise InvalidRequest(name, f"expected one string, got {len(texts)}")
        return texts[0]


def decode_utf8(value: object, name: str) -> str:
    if isinstance(value, str):
        return value
    try:
        return bytes(value).decode("utf-8")
    except UnicodeDecodeError as error:
        raise InvalidRequest(name, f"is not valid UTF-8 ({error.reason} at byte {error.start})") from None


def refuse_non_finite(name: str, value: np.ndarray) -> None:
    """A floating-point input holding NaN or an infinity is refused, naming the input (other dtypes pass)."""
    array = np.asarray(value)
    if array.dtype.kind != "f" or bool(np.isfinite(array).all()):
        return
    flat = array.reshape(-1)
    index = int(np.flatnonzero(~np.isfinite(flat))[0])
    where = "" if flat.size == 1 else f" at index {index}"
    raise InvalidRequest(name, f"must be a finite number, got {float(flat[index])}{where}")


# JSON that clients send inside a string input is measured before anything parses it: Python's json (messages)
# recurses once per nesting level (a few thousand levels raise RecursionError), and xgrammar's JSON-schema
# converter (guided_decoding_guide) takes 0.7 s at 256 levels, 10 s at 600, on the engine's thread. A chat
# nests 2 levels; 64 leaves any real schema room.
MAX_JSON_DEPTH = 64
_JSON_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)


def json_nesting_depth(text: str) -> int:
    """How deep the arrays and objects of a JSON text nest (0 for a scalar); brackets inside strings do not count.
    For text about to be decoded: on invalid JSON (an unterminated string) the count may be off, and decoding fails."""
    structure = np.frombuffer(_JSON_STRING.sub("", text).encode(), np.uint8)
    # "[" "]" are 0x5b 0x5d and "{" "}" 0x7b 0x7d: setting bit 5 maps the first pair onto the second (and no other
    # byte onto either).
    bracket = structure | 0x20
    steps = (bracket == ord("{")).astype(np.int32) - (bracket == ord("}")).astype(np.int32)
    return int(np.cumsum(steps).max(initial=0))


def refuse_deep_json(text: str, name: str, max_depth: int = MAX_JSON_DEPTH) -> None:
    """JSON text nested deeper than max_depth is an InvalidRequest naming the input."""
    depth = json_nesting_depth(text)
    if depth > max_depth:
        raise InvalidRequest(name, f"nests JSON {depth} levels deep; at most {max_depth} are accepted")


def decode_json(text: str, name: str, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """A JSON input's value; invalid JSON, JSON nested deeper than max_depth, or a lone surrogate escape in it, is an
    InvalidRequest naming it."""
    refuse_deep_json(text, name, max_depth)
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        raise InvalidRequest(name, f"is not valid JSON ({error})") from None
    where = lone_surrogate_at(value)
    if where is not None:
        raise InvalidRequest(name, f"{LONE_SURROGATE} at {where}" if where else LONE_SURROGATE)
    return value


# JSON's \uXXXX escapes may spell half of a UTF-16 surrogate pair alone ("\ud800"): json.loads gives a str holding
# that code point, which is no character and which UTF-8 cannot encode (str.encode raises). Every decoded string is
# checked before it is used; a pair (a character beyond the BMP) decodes to one code point and passes.
LONE_SURROGATE = "holds a lone UTF-16 surrogate escape (half of a surrogate pair is not a character)"
_SURROGATE = re.compile("[\ud800-\udfff]")


def lone_surrogate_at(value: Any, where: str = "") -> str | None:
    """Where decoded JSON holds a string (a value or an object's key) with a lone surrogate, as `.key` and `[index]`
    steps from `value` ("" for value itself); None when it holds none."""
    if isinstance(value, str):
        return where if _SURROGATE.search(value) else None
    if isinstance(value, dict):
        for key, item in value.items():
            if _SURROGATE.search(key):
                return f"{where}.{key.encode('utf-8', 'backslashreplace').decode()}"
            found = lone_surrogate_at(item, f"{where}.{key}")
            if found is not None:
                return found
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found = lone_surrogate_at(item, f"{where}[{index}]")
            if found is not None:
                return found
    return None
