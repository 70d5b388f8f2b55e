# Two commands for a newcomer: `make demo` (set up, then plan/render/check/launch the bundled tiny
# model on this machine's CPU) and `make test` (set up, then the test suite).
SHELL := /bin/bash
VENV := .venv
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)
export TORCH_EXTENSIONS_DIR ?= $(CURDIR)/.cache/torch_extensions
export ZEROKIT_CACHE_DIR ?= $(CURDIR)/.cache/zerokit
# torch.compile's Inductor kernels (the compile tests' ranks): in the clone, not /tmp, so they leave with it
export TORCHINDUCTOR_CACHE_DIR ?= $(CURDIR)/.cache/torchinductor
DEMO := runs/demo

.PHONY: setup demo test bench clean

setup:
	@bash scripts/setup.sh

# The demo's step-time prediction rests on this machine's figures for what its plan prices, measured once (~1.5 min):
# the tiny Llama's block family, fp32 and the fastest 16-bit precision, a full fine-tune (no LoRA models), one pass of
# DeepSpeed's plain engines per ZeRO stage in that 16-bit precision. The whole profile is `zerokit calibrate`
# (~10 min), an explicit command.
demo: setup
	@rm -rf $(DEMO)
	zerokit calibrate --quick --model tiny-llama --finetune full --if-missing
	zerokit plan tiny-llama --gpu cpu --gpus-per-node 2 --seq-len 64 --global-batch 8 --samples 256
	@mkdir -p $(DEMO)
	zerokit render tiny-llama --gpu cpu --gpus-per-node 2 --seq-len 64 --global-batch 8 -o $(DEMO)/ds_config.json
	zerokit check $(DEMO)/ds_config.json --model tiny-llama --gpu cpu --gpus-per-node 2 --seq-len 64
	zerokit launch --model tiny-llama --config $(DEMO)/ds_config.json --gpu cpu --gpus-per-node 2 --seq-len 64 \
		--steps 20 --save-every 10 --output-dir $(DEMO)/run

# Two test files at a time (pytest-xdist; a file's tests stay on one worker: they share module fixtures; in
# tests/conftest.py's order, the files with the most real multi-rank jobs first, not xdist's most-tests-first), then
# the calibrations (-m timed) alone: they fit what they time and refuse a busy machine. The other tests count and
# compare, so a second file beside them costs time, not correctness.
# PYTHONDONTWRITEBYTECODE (set on some machines) is cleared for the tests: the suite starts hundreds of rank processes,
# and each would compile zerokit's modules (and pytest rewrite the tests) again instead of reading the cached bytecode.
test: setup
	@bash scripts/setup_browser.sh
	ruff check .
	PYTHONDONTWRITEBYTECODE= python -m pytest -q -p no:cacheprovider -m "not timed" -n 2 --dist loadfile \
		--no-loadscope-reorder --durations=25
	PYTHONDONTWRITEBYTECODE= python -m pytest -q -p no:cacheprovider -m timed --durations=10

bench: setup
	python bench/plan_latency.py

clean:
	rm -rf runs .cache/zerokit
