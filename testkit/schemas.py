"""The JSON schema a guided document is checked against: the guide's own, less what the xgrammar that enforced it
does not enforce.

xgrammar 0.1.32 (what TensorRT-LLM 1.2.1 pins and the 26.07 image ships) bounds numbers by their digits only: a
"maximum" of 120 admits 121-129 and a number's "maximum" of 100 admits 100.5 (measured here with both versions; the
container rehearsal's tests saw 122 under "maximum": 120). 0.2.8 (this project's venv) enforces them exactly. The
suite runs beside the server it tests (the same venv here; in the container its clients' venv sits over the image's
site-packages), so the installed xgrammar is the server's.
"""

from __future__ import annotations

import copy
import importlib.metadata

import jsonschema

NUMERIC_BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")


def enforces_numeric_bounds(version: str | None = None) -> bool:
    version = version or importlib.metadata.version("xgrammar")
    major, minor = (int(part) for part in version.split(".")[:2])
    return (major, minor) >= (0, 2)


def enforced_schema(schema: dict, version: str | None = None) -> dict:
    if enforces_numeric_bounds(version):
        return schema
    stripped = copy.deepcopy(schema)

    def strip(node):
        if isinstance(node, dict):
            for key in NUMERIC_BOUNDS:
                node.pop(key, None)
            for value in node.values():
                strip(value)
        elif isinstance(node, list):
            for value in node:
                strip(value)

    strip(stripped)
    return stripped


def validate_guided(document, schema: dict) -> None:
    """jsonschema.validate against what the installed xgrammar enforces of `schema`."""
    jsonschema.validate(document, enforced_schema(schema))
