#!/usr/bin/env bash
# What to run when a GPU is lent (the device tool: one H100/H200, ~15 min of device time in all): under 9 minutes.
#   here:   bash scripts/gpu_wheels.sh            (once: DeepSpeed and what it needs, into .gpu_wheels/)
#   there:  bash bench/gpu_lend.sh                (run with carry [".gpu_wheels"]; results under $OUT, else bench/results)
# 0. bench/ulysses_attention_probe.py: a Ulysses rank's attention, measured against its pricing (issue 28); then
#    bench/liger_int32_probe.py --device cuda: liger-kernel's 32-bit offsets compiled on the GPU;
# 1. zerokit calibrate --quick on the GPU, for the lend models' block family (the profile a plan there would use);
# 2. bench/accuracy/run.py --lend: real one-rank DeepSpeed jobs of 1B and 3B Llama shapes (random weights, seq
#    2048-4096, ZeRO-0..3, bf16, checkpointing on and off), each measuring step time and peak memory (allocated,
#    reserved, nvidia-smi), in LEND's order until the time budget is spent;
# 3. the same runs predicted twice, on the catalog's figures and on the profile from 1: before and after calibration.
# Tiny models measure the host, not the GPU (the last lend): these are sized so that the GPU sets the step time.
#   LEND_SET=long bash bench/gpu_lend.sh: issue 45's check instead: run.py's LONG rows (gpu-1b at 32K, 64K and 128K
#   tokens, ZeRO-3, checkpoint offload, tiled MLP), measured against the plan at each length, then plan --seq-len max.
#   LEND_JOBS=N runs only the list's first N rows (LONG: 3 by default; its 256K row takes ~3 min at 2 steps, run alone);
#   LEND_PROBES=0 skips step 0 (a second call on the same lend).
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} ZEROKIT_CACHE_DIR=/tmp/zerokit-cache
RES=${OUT:-bench/results}
STAMP=$(date +%Y%m%d_%H%M)
# LEND_SET=long (issue 45): run.py's LONG rows instead of LEND's, one model at three long lengths with checkpoint
# offload and tiled MLP, allocated / reserved / nvidia-smi against the plan (and plan --seq-len max's answer, saved
# last); no probes and no calibration, so the jobs get the time
SET=${LEND_SET:-lend}
STEPS=8 WARMUP=2
case "$SET" in lend) LIST=LEND;; long) LIST=LONG STEPS=4 WARMUP=1 LEND_JOBS=${LEND_JOBS:-3}; CALIBRATE_S=${CALIBRATE_S:-0};; *)
  echo "gpu_lend: LEND_SET is lend or long, not $SET"; exit 2;; esac
case "${LEND_JOBS:-99}" in ''|*[!0-9]*) echo "gpu_lend: LEND_JOBS is a count of rows, not ${LEND_JOBS}"; exit 2;; esac
BUDGET_S=${BUDGET_S:-480}  # stop starting jobs after this; a job took 34-76 s on an H200 (run with timeout_s 600)
t0=$(date +%s)
python3 -c "import deepspeed" 2>/dev/null || {
  DS_BUILD_OPS=0 python3 -m pip install -q --no-index --find-links .gpu_wheels --no-build-isolation \
    deepspeed hjson pydantic >/dev/null && python3 -m pip install -q --no-index --no-deps --find-links .gpu_wheels \
    transformers >/dev/null || { echo "gpu_lend: cannot install from .gpu_wheels (run scripts/gpu_wheels.sh here and carry it)"; exit 2; }
}
# The lent image sets TORCH_CUDA_ARCH_LIST=9.0a, which DeepSpeed 0.19's JIT op builder cannot parse (launch's check
# refuses it, DeepSpeed#8619): the plain architecture builds the same FusedAdam for these jobs.
case "${TORCH_CUDA_ARCH_LIST:-}" in *[0-9]a*) export TORCH_CUDA_ARCH_LIST=$(echo "$TORCH_CUDA_ARCH_LIST" | sed 's/\([0-9]\)a/\1/g');; esac
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch, deepspeed, transformers; print('torch', torch.__version__, 'deepspeed', deepspeed.__version__, 'transformers', transformers.__version__)"
if [ "$SET" = lend ] && [ "${LEND_PROBES:-1}" != 0 ]; then
  # issue 28: one Ulysses rank's attention at Llama-3.1-8B's per-rank heads, SP 8 / 16 / 32, at 1M tokens (~1 min)
  timeout 150 python3 bench/ulysses_attention_probe.py --out "$RES/ulysses_attention_probe_$STAMP.txt" \
    || echo "gpu_lend: the attention probe did not finish"
  # issue 28: liger-kernel 0.8.3's RMSNorm and RoPE compiled on the GPU, rows past element 2^31 (the interpreter's
  # result in bench/results/liger_int32_probe.txt: the block kernel crashes; ~1 min)
  python3 -m pip install -q --no-index --no-deps --find-links .gpu_wheels --target /tmp/liger-0.8.3 liger-kernel==0.8.3 \
    >/dev/null && PYTHONPATH=/tmp/liger-0.8.3:$PYTHONPATH timeout 180 python3 bench/liger_int32_probe.py --device cuda \
    --out "$RES/liger_int32_probe_gpu_$STAMP.txt" || echo "gpu_lend: the Liger probe did not finish"
fi
PROFILE=$RES/gpu_profile_$STAMP.json
CALIBRATE_S=${CALIBRATE_S:-240}  # 0: no calibration (a second short lend: the rows only); >180 s on an H200
[ "$CALIBRATE_S" -gt 0 ] && { timeout "$CALIBRATE_S" python3 -m zerokit calibrate --quick --model bench/accuracy/models/gpu-1b \
  -o "$PROFILE" || echo "gpu_lend: calibrate did not finish in $CALIBRATE_S s; the runs are predicted on the catalog only"; }
RUNS=/tmp/zerokit-lend
for name in $(python3 -c "import sys; sys.path.insert(0, 'bench/accuracy'); import run; print(' '.join(j.name for j in run.$LIST[:${LEND_JOBS:-99}]))"); do
  if [ $(( $(date +%s) - t0 )) -gt "$BUDGET_S" ]; then echo "gpu_lend: budget spent, $name and later not run"; break; fi
  j0=$(date +%s)
  python3 bench/accuracy/run.py "--$SET" --only "^${name}\$" --steps $STEPS --warmup $WARMUP --runs "$RUNS" --no-save \
    --timeout 240 --results "/tmp/lend_$name" >/dev/null 2>"/tmp/lend_$name.err" || tail -3 "/tmp/lend_$name.err"
  # where a job's time went: the rank's start record (launching/train.py main: setup, model, engine seconds)
  echo "gpu_lend: $name $(( $(date +%s) - j0 )) s; rank 0 startup $(python3 -c "import json,sys
for l in open(sys.argv[1]):
    r = json.loads(l)
    if r.get('event') == 'start': print({k: round(v, 1) for k, v in (r.get('startup_phases_s') or {}).items()})" \
    "$RUNS/$SET/$name/metrics/rank0.jsonl" 2>/dev/null)"
done
# the jobs that ran (--reuse alone would run the others now)
ran=$(cd "$RUNS/$SET" 2>/dev/null && ls -d */metrics/rank0.jsonl 2>/dev/null | cut -d/ -f1 | paste -sd'|')
[ -n "$ran" ] || { echo "gpu_lend: no job ran"; exit 1; }
python3 bench/accuracy/run.py "--$SET" --reuse --only "^($ran)\$" --runs "$RUNS" --steps $STEPS --warmup $WARMUP \
  --results "$RES/accuracy_gpu_${SET}_$STAMP"
[ -f "$PROFILE" ] && python3 bench/accuracy/run.py "--$SET" --reuse --only "^($ran)\$" --runs "$RUNS" --steps $STEPS \
  --warmup $WARMUP --hardware-profile "$PROFILE" --results "$RES/accuracy_gpu_${SET}_${STAMP}_calibrated"
[ "$SET" = long ] && python3 -m zerokit plan bench/accuracy/models/gpu-1b --gpu auto --seq-len max --stage 3 \
  --activation-checkpointing offload --tiled-loss on --tiled-mlp on --micro-batch 1 --json > "$RES/long_seq_len_max_$STAMP.json"
echo "gpu_lend: $(( $(date +%s) - t0 )) s"
