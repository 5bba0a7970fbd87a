#!/usr/bin/env bash
# Validate flatcollate's CUDA paths on a machine with a GPU, in one command; writes one markdown report.
#
#   tools/gpu_validate.sh [REPORT]        (default REPORT: gpu-validate-report.md; run from the repository root)
#
# Environment: PYTHON (default: python), FAMILIES (default: "llama qwen2 mistral gemma2 gpt_oss"), BENCH_OUT (default:
# gpu-validate-bench). Steps, each recorded with its command, exit status and output tail:
#   1. environment: GPU, torch and CUDA versions, flash-attn, and the capabilities flatcollate detected;
#   2. tests/attention: the real flash_attn_varlen_func and varlen_attn against the slow references (outputs and
#      gradients, bf16) -- these skip without CUDA or without the kernel -- plus the reference-kernel model proofs;
#   3. `flatcollate check` per family: in fp32 on the CPU, and on CUDA in bf16 (through the real kernels, with the
#      tolerance from the bf16 per-sequence run's own error);
#   4. `flatcollate bench --device cuda --dtype bfloat16`, three repeats of padded, hf_flattened and flattened.
# It ends with one screen on stdout: each step's verdict and the time so far, the bench's headline, the report's path.
# Exit status: 0 when every step passed, 1 when one failed, 2 without a CUDA device (steps 1-3 still run).
set -u -o pipefail

REPORT=${1:-gpu-validate-report.md}
PYTHON=${PYTHON:-python}
FAMILIES=${FAMILIES:-llama qwen2 mistral gemma2 gpt_oss}
BENCH_OUT=${BENCH_OUT:-gpu-validate-bench}
STATUS=0
SUMMARY=()
LOG=$(mktemp)
trap 'rm -f "$LOG"' EXIT

# step TITLE COMMAND...: run a command, append its status and the last 60 lines of its output to the report.
step() {
    local title=$1
    shift
    local shown="${*//$'\n'/ }"
    [ "${#shown}" -le 160 ] || shown="${shown:0:157}..."
    echo "== $title: $shown" >&2
    "$@" >"$LOG" 2>&1
    local code=$?
    [ "$code" -eq 0 ] || STATUS=1
    SUMMARY+=("$([ "$code" -eq 0 ] && echo "ok    " || echo "FAILED") $title ($SECONDS s so far)")
    {
        echo "## $title"
        echo
        echo "\`$shown\` -> exit status $code"
        echo
        echo '```'
        tail -n 60 "$LOG"
        echo '```'
        echo
    } >>"$REPORT"
    return 0
}

# headline_of FILE: the bench's headline lines in its output (not the "wrote ..." lines that follow them).
headline_of() {
    grep -E " trains [0-9.]+x the |own padding-free path|^WARNING" "$1"
}

{
    echo "# flatcollate GPU validation"
    echo
    echo "$(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
    echo
} >"$REPORT"

command -v nvidia-smi >/dev/null && step "GPU" nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
step "Environment and detected capabilities" "$PYTHON" -c '
import importlib.metadata as md, torch, transformers
from flatcollate.attention import capabilities as c
print("torch", torch.__version__, "cuda", torch.version.cuda, "transformers", transformers.__version__)
for name in ("flash-attn", "flash-attn-3", "flash-attn-4"):
    try:
        print(name, md.version(name))
    except md.PackageNotFoundError:
        pass
print(c.detected())
if torch.cuda.is_available():
    from flatcollate.attention import select_kernel
    print(torch.cuda.get_device_name(), "capability", torch.cuda.get_device_capability())
    q = torch.zeros(8, 4, 128, device="cuda", dtype=torch.bfloat16)
    print("auto picks, bf16 D=128:", select_kernel(q, softcap=None, dropout=0.0),
          "| with a window:", select_kernel(q, softcap=None, dropout=0.0, window=64),
          "| with soft-capping:", select_kernel(q, softcap=30.0, dropout=0.0))
'
# -rs lists every skipped test with its reason: a real-kernel test skipped on a GPU machine is worth reading.
step "Attention and state-carrying-layer tests (real kernels vs references)" "$PYTHON" -m pytest -q -rs -p no:cacheprovider tests/attention \
    tests/bench/test_throughput.py::test_cuda_memory_is_measured_when_available \
    tests/modeling/test_mixer_kernels.py::test_real_kernels_on_cuda
HAS_CUDA=0
"$PYTHON" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' && HAS_CUDA=1
for family in $FAMILIES; do
    step "flatcollate check $family" "$PYTHON" -m flatcollate check "$family"
    if [ "$HAS_CUDA" -eq 1 ]; then
        step "flatcollate check $family (CUDA, bf16)" "$PYTHON" -m flatcollate check "$family" --device cuda \
            --dtype bfloat16
    fi
done

if [ "$HAS_CUDA" -eq 1 ]; then
    # Three repeats of the three modes that make the headline: nine fresh processes, a few minutes on one GPU.
    step "flatcollate bench (CUDA, bf16)" "$PYTHON" -m flatcollate bench --device cuda --dtype bfloat16 \
        --repeats 3 --modes padded hf_flattened flattened --out-dir "$BENCH_OUT" --no-progress
    BENCH_HEADLINE=$(headline_of "$LOG")
    echo "Bench tables and plots: \`$BENCH_OUT/\`." >>"$REPORT"
else
    echo "## No CUDA device: the real-kernel tests skipped and the bench did not run." >>"$REPORT"
    [ "$STATUS" -eq 0 ] && STATUS=2
fi

# One screen: every step's verdict, the bench's headline, where the details are.
printf '%s\n' "${SUMMARY[@]}"
[ -n "${BENCH_HEADLINE:-}" ] && printf '\n%s\n' "$BENCH_HEADLINE"
echo "Report: $REPORT (exit status $STATUS, $SECONDS s)"
exit "$STATUS"
