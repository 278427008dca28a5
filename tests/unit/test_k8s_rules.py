"""deploy/prometheus/rules.yaml through promtool (Debian's `prometheus` package): the rules check, and their unit
tests (rules_test.yaml: the autoscaling signal, the error ratio, first-token p95 and the alerts firing when they
should and staying quiet when they should not)."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from deploy.render import RULES

PROMTOOL = shutil.which("promtool")
pytestmark = pytest.mark.skipif(PROMTOOL is None, reason="promtool is not installed (Debian: apt-get install -y "
                                                         "prometheus); the rules are not checked")


def promtool(*args: str) -> str:
    result = subprocess.run([PROMTOOL, *args], cwd=RULES.parent, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def test_promtool_checks_the_rules():
    assert "SUCCESS" in promtool("check", "rules", RULES.name)


def test_promtool_unit_tests_the_rules():
    assert "SUCCESS" in promtool("test", "rules", "rules_test.yaml")
