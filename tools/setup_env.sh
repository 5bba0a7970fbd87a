#!/usr/bin/env bash
# Creates .venv with the CPU build of PyTorch and flatcollate (editable) with its test extras, at tested versions.
# Set TORCH_SPEC to install another torch build (e.g. a CUDA one) instead.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q "${TORCH_SPEC:-torch==2.13.0}"
.venv/bin/python -m pip install -q -c tools/constraints.txt -e ".[test]"
.venv/bin/python -c "import flatcollate, torch, transformers; print('flatcollate', flatcollate.__version__, \
'| torch', torch.__version__, '| transformers', transformers.__version__)"
