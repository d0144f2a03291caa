#!/usr/bin/env bash
# Create .venv and install AIR with its test tools. torch 2.13.0 (the CPU wheel on this
# machine) goes in first, so that nothing later pulls a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
# The node daemon's shepherd is a small C program built with the package (without a compiler it falls
# back to a Python shepherd, several times the CPU a run; the tests insist on the program).
if ! command -v cc >/dev/null && [ "$(id -u)" = 0 ]; then
  apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq gcc libc6-dev >/dev/null
fi
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
.venv/bin/python -m pip install -q torch==2.13.0 2>&1 | grep -v -i "warning" || true
# Installed as air.* (not editable: the daemons and tests run what was installed; run this again
# after a change, and the test suite checks that it was).
rm -rf build   # (setuptools would install again what an earlier build left there)
.venv/bin/python -m pip install -q '.[test,runtime]' 2>&1 | grep -v -i "warning" || true
.venv/bin/python -c "import torch, grpc, air.airctld, air.airnoded, air.aircli, air.runtime" || { echo "setup: install failed" >&2; exit 1; }
