#!/usr/bin/env bash
# Creates .venv with the CPU build of PyTorch and flatcollate (editable) with its bench and test extras, at tested
# versions.
#
# Another torch build (e.g. CUDA): set TORCH_SPEC (a pip requirement, default torch==2.13.0) and/or TORCH_INDEX_URL
# (the index it comes from); the torch pin of tools/constraints.txt is then left out, so it cannot clash:
#   TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128 bash tools/setup_env.sh
#   TORCH_SPEC="torch>=2.6" bash tools/setup_env.sh
# EXTRAS picks the extras installed with flatcollate (default bench,test: the benchmark's plots, what the tests need;
# with LATEST=1 bench,test,vision).
#
# LATEST=1 creates .venv-latest instead, with the newest releases pip resolves (torch, transformers, TRL, ...: no
# constraints), as a user installing without them gets, and the vision extra: torchvision, installed in the same pip
# call as torch so that pip picks the build made for it (each torchvision pins one torch release), for the video
# tests; CI runs the fast tier there too.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -c 'import sys; sys.exit(sys.version_info < (3, 10) and "flatcollate needs Python >= 3.10")'
venv=.venv
torch_spec=${TORCH_SPEC:-torch==2.13.0}
vision=()
if [[ -n "${LATEST:-}" ]]; then
    venv=.venv-latest
    torch_spec=${TORCH_SPEC:-torch}
    EXTRAS=${EXTRAS:-bench,test,vision}
    vision=(torchvision)
fi
python3 -m venv "$venv"
"$venv"/bin/python -m pip install -q --upgrade pip
"$venv"/bin/python -m pip install -q ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"} "$torch_spec" "${vision[@]}"
constraints=tools/constraints.txt
if [[ -n "${LATEST:-}" ]]; then
    constraints=/dev/null
elif [[ -n "${TORCH_SPEC:-}${TORCH_INDEX_URL:-}" ]]; then
    constraints=$(mktemp)
    grep -v '^torch==' tools/constraints.txt > "$constraints"
fi
"$venv"/bin/python -m pip install -q ${LATEST:+--upgrade} -c "$constraints" -e ".[${EXTRAS:-bench,test}]"
# fla's naive PyTorch references (the proofs of the state-carrying layers' kernel path read them from here): kept off
# the import path, where an fla without Triton would be found as a kernel that cannot load
"$venv"/bin/python -m pip install -q -c "$constraints" einops
"$venv"/bin/python -m pip install -q --no-deps --upgrade --target "$venv/references" fla-core==0.6.0
"$venv"/bin/python -c "import flatcollate, torch, transformers; print('flatcollate', flatcollate.__version__, \
'| torch', torch.__version__, '| transformers', transformers.__version__)"
