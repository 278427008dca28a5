"""The integration suite's skip tables name tests and modules that exist: a renamed test would otherwise drop out of
NEEDS_EMBEDDED_ENGINE without a word and fail against a real engine instead of skipping (or the reverse)."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.integration.conftest import NEEDS_EMBEDDED_ENGINE, STARTS_ITS_OWN_SERVER

INTEGRATION = Path(__file__).resolve().parents[1] / "integration"


def _test_functions() -> set[str]:
    names = set()
    for module in INTEGRATION.glob("test_*.py"):
        names |= {node.name for node in ast.walk(ast.parse(module.read_text()))
                  if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")}
    return names


def test_every_test_named_in_a_skip_table_exists():
    assert sorted(set(NEEDS_EMBEDDED_ENGINE) - _test_functions()) == []
    assert sorted(name for name in STARTS_ITS_OWN_SERVER if not (INTEGRATION / name).is_file()) == []
