#!/usr/bin/env bash
# The Python packages a lent GPU machine lacks (it has torch, transformers, peft, accelerate, but no DeepSpeed and no
# network), downloaded here into .gpu_wheels/ for bench/gpu_lend.sh: carry .gpu_wheels with the run. DeepSpeed ships
# as an sdist only (built there with DS_BUILD_OPS=0: its ops are JIT-built on first use); transformers at the version
# the tests pin, without its dependencies (the machine's tokenizers / huggingface_hub / safetensors satisfy its ranges).
set -euo pipefail
cd "$(dirname "$0")/.."
PIP=${PIP:-.venv/bin/pip}
PYV=${GPU_PYTHON_VERSION:-3.12}  # the lent machines' python3 (/opt/torch/.venv), as their image was read in 2026-11
out=.gpu_wheels
mkdir -p "$out"
ds=$(grep '^deepspeed==' constraints-cpu.txt)
tf=$(grep '^transformers==' constraints-cpu.txt)
"$PIP" download -q --no-deps --no-binary=:all: -d "$out" "$ds"
"$PIP" download -q --no-deps --only-binary=:all: -d "$out" "$tf"
"$PIP" download -q --only-binary=:all: --python-version "$PYV" --implementation cp --abi "cp${PYV/./}" \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$out" hjson "pydantic>=2"
# bench/liger_int32_probe.py --device cuda: the last liger-kernel whose block RMSNorm kernel is 32-bit (pure Python)
"$PIP" download -q --no-deps --only-binary=:all: -d "$out" liger-kernel==0.8.3
du -sh "$out"
