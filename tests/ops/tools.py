"""Helpers for the deployment tests: external tools, PromQL metric-name extraction, file paths.

A missing tool fails the test when CI is set (scripts/setup.sh installs them: a missing install
step must not become a silent skip) and skips it elsewhere.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEPLOY = os.path.join(ROOT, "deploy")
RULES = os.path.join(DEPLOY, "prometheus", "rules", "tidemq-alerts.yml")
DASHBOARD_DIR = os.path.join(DEPLOY, "grafana", "dashboards")
HINTS = {"promtool": "Debian package prometheus", "prometheus": "Debian package prometheus",
         "docker-compose": "Debian package docker-compose",
         "check-jsonschema": "PyPI check-jsonschema (test extra)",
         "kubernetes-validate": "PyPI kubernetes-validate (test extra)",
         "yamllint": "PyPI yamllint (test extra)", "kubectl": "kubectl"}


def tool(name: str, required: bool = True) -> str | None:
    """The tool's path; a missing one fails under CI (skips elsewhere), or is None when
    `required` is false (kubectl: used where installed)."""
    venv_bin = os.path.join(os.path.dirname(sys.executable), name)
    path = venv_bin if os.access(venv_bin, os.X_OK) else shutil.which(name)
    if path is None and required:
        msg = f"{name} is not installed ({HINTS.get(name, name)}; scripts/setup.sh installs it)"
        if os.environ.get("CI"):
            pytest.fail(msg)
        pytest.skip(msg)
    return path


def run(args, cwd=ROOT, stdin: str | None = None, timeout: float = 120) -> str:
    """Run a checker; its whole output goes into the assertion message when it fails."""
    proc = subprocess.run(args, cwd=cwd, input=stdin, capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, (f"{' '.join(map(str, args))} exited {proc.returncode}:\n"
                                  f"{proc.stdout}\n{proc.stderr}")
    return proc.stdout + proc.stderr


# -- PromQL -----------------------------------------------------------------------------------
_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or",
             "unless", "offset", "inf", "nan", "le"}
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'')
_GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_IDENT = re.compile(r"(?<![\w:$.])([a-zA-Z_:][a-zA-Z0-9_:]*)(?![\w:])(\s*\()?")


def metric_names(expr: str) -> set[str]:
    """Series names an expression selects (functions, keywords, labels and strings removed)."""
    text = _STRING.sub('""', expr)
    text = re.sub(r"\{[^}]*\}", "", text)       # label matchers
    text = re.sub(r"\[[^\]]*\]", "", text)      # ranges
    text = _GROUPING.sub("", text)
    names = set()
    for m in _IDENT.finditer(text):
        word, call = m.group(1), m.group(2)
        if call or word.lower() in _KEYWORDS or word.startswith("__"):
            continue
        names.add(word)
    return names


def grafana_to_promql(expr: str) -> str:
    """A panel query with Grafana's variables replaced by what Prometheus accepts."""
    expr = expr.replace("$__rate_interval", "1m").replace("$__interval", "1m")
    expr = expr.replace("$__range", "1h")
    return re.sub(r"\$\{?\w+\}?", ".*", expr)
