#!/usr/bin/env bash
# Full `egpu-setup verify` on a machine with an NVIDIA GPU and a CUDA build of torch; writes the
# JSON report (named after the GPU) to $OUT, else docs/reports/, plus the table, the stderr and
# the machine's nvidia-smi / torch facts.
#
#   scripts/gpu_verify.sh [--python PATH] [extra verify options...]
#
# Target Python: --python PATH, else $EGPU_SETUP_PYTHON, else /opt/egpu-setup/venv/bin/python,
# else python3. It needs torch with CUDA (e.g. torch from https://download.pytorch.org/whl/cu128).
# Profile: $EGPU_SETUP_PROFILE, else generic-nvidia, unless the options name one: it fits any
# card, an eGPU or a datacenter GPU in a server slot (the link and bandwidth checks judge a card
# in a slot against that slot's own link; the identity check needs the detected GPU, not an
# external one). The tool runs from this checkout with $EGPU_SETUP_TOOL_PYTHON, else a python3
# that has its dependencies, else a throwaway venv (that needs a package index).
# The full run takes about a minute; each step has a time budget, the hard timeout is 300 s.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out_dir=${OUT:-$repo/docs/reports}
mkdir -p "$out_dir"

python=${EGPU_SETUP_PYTHON:-}
if [[ ${1:-} == --python ]]; then
    python=$2
    shift 2
fi
if [[ -z $python ]]; then
    if [[ -x /opt/egpu-setup/venv/bin/python ]]; then
        python=/opt/egpu-setup/venv/bin/python
    else
        python=$(command -v python3)
    fi
fi

profile=()
if [[ " $* " != *" --profile "* && " $* " != *" --profile="* ]]; then
    profile=(--profile "${EGPU_SETUP_PROFILE:-generic-nvidia}")
fi

deps='import click, distro, yaml, jinja2, packaging, requests'
tool_py=${EGPU_SETUP_TOOL_PYTHON:-python3}
if ! "$tool_py" -c "$deps" 2>/dev/null; then
    if "$python" -c "$deps" 2>/dev/null; then
        tool_py=$python  # the target venv has them too
    else
        tool_venv=$(mktemp -d)/venv
        python3 -m venv "$tool_venv"
        if ! "$tool_venv/bin/pip" install -q click distro pyyaml jinja2 packaging requests; then
            echo "error: no Python here has egpu-setup's dependencies, and pip cannot fetch them" >&2
            echo "hint: set EGPU_SETUP_TOOL_PYTHON to a python3 with click, distro, pyyaml, jinja2, packaging, requests" >&2
            exit 2
        fi
        tool_py=$tool_venv/bin/python
    fi
fi

state=$(mktemp -d)
export EGPU_SETUP_STATE_DIR=$state
export PYTHONPATH=$repo${PYTHONPATH:+:$PYTHONPATH}

gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n1 || true)
slug=$(printf '%s' "${gpu:-unknown-gpu}" | tr '[:upper:]' '[:lower:]' | tr -cs 'a-z0-9' '-' | sed 's/-$//')
stamp=$(date -u +%Y%m%dT%H%M%SZ)
base=$out_dir/verify-$slug-$stamp

{
    echo "# $(date -u) on $(hostname)"
    nvidia-smi || true
    nvidia-smi -q -d PCIE,TEMPERATURE,POWER,PERFORMANCE || true
    "$python" -c 'import torch, sys; print(sys.version); print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.is_available())' || true
} >"$base.env.txt" 2>&1

rc=0
"$tool_py" -m egpu_setup -v verify --python "$python" --timeout 300 "${profile[@]}" "$@" --json \
    >"$base.json" 2>"$base.stderr.txt" || rc=$?
# the human table too, from the saved report (no second GPU run)
"$tool_py" - "$base.json" >"$base.txt" <<'PY' || true
import json, sys
from egpu_setup.verify.checks import Check
from egpu_setup.verify.report import VerifyReport, render_table
d = json.load(open(sys.argv[1]))
checks = tuple(Check(c["id"], c["status"], c["detail"], c["value"], c["expected"], c["seconds"], c["hint"]) for c in d["checks"])
print(render_table(VerifyReport(checks, d["device"], d["python"], d["profile"], d["options"], d["outcome"], 0.0, d["seconds"], d["hostname"], d["host"])))
PY
cat "$base.txt" || true
echo "verify exit status $rc; report: $base.json" >&2
exit "$rc"
