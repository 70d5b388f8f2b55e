"""The bad-input table: every command, every kind of bad value, one row each. Each row asserts what zerokit
guarantees on bad input (docs/bad-input.md): the exit code, exactly one line on stderr that starts with `error:`
and names no Python exception, nothing on stdout, and nothing left on disk (the working directory holds only the
files the row wrote as input).

Rows run in-process (zerokit.cli.main) in a fresh working directory; none gets as far as starting a rank.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from zerokit.cli import main

REPO = Path(__file__).resolve().parents[1]
TINY = json.loads((REPO / "zerokit/data/models/tiny-llama/config.json").read_text())
GOOD_DS = {"train_batch_size": 8, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2,
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}, "zero_optimization": {"stage": 2}}
EXCEPTION_NAME = re.compile(r"Traceback|\b[A-Z][A-Za-z]*(Error|Exception|Warning)\b")
P = ["--params", "7e9"]
CHECK = ["--params", "7e9", "--gpus-per-node", "2", "--gpu", "a100-80gb"]
LAUNCH = ["launch", "--model", "tiny-llama", "--gpu", "cpu", "--gpus-per-node", "2", "--seq-len", "32", "--steps", "2"]
# the bundled tokenizer without its chat template: chat data needs one
NO_TEMPLATE_TOKENIZER = {
    "tok/tokenizer.json": (REPO / "zerokit/data/tokenizer/tokenizer.json").read_text(),
    "tok/tokenizer_config.json": json.dumps({k: v for k, v in json.loads(
        (REPO / "zerokit/data/tokenizer/tokenizer_config.json").read_text()).items() if k != "chat_template"}),
}
CHAT_RECORD = json.dumps({"messages": [{"role": "user", "content": "What is 2 plus 3?"},
                                       {"role": "assistant", "content": "2 plus 3 is 5."}]}) + "\n"


def ds(**changes) -> str:
    return json.dumps({**GOOD_DS, **changes})


def zero(**block) -> str:
    return json.dumps({**GOOD_DS, "zero_optimization": {"stage": 2, **block}})


def model_config(**changes) -> str:
    return json.dumps({**TINY, **changes})


# (id, argv, files to write first {relative path: text or bytes}, expected exit code, text the error line contains)
ROWS = [
    # ---- the command line itself
    ("no-command", [], {}, 2, "no command"),
    ("unknown-command", ["frobnicate"], {}, 2, "invalid choice"),
    ("unknown-option", ["plan", *P, "--frobnicate"], {}, 2, "unrecognized"),
    # ---- parameter counts (plan)
    ("params-overflow", ["plan", "--params", "1e400"], {}, 2, "finite"),
    ("params-inf", ["plan", "--params", "inf"], {}, 2, "finite"),
    ("params-nan", ["plan", "--params", "nan"], {}, 2, "finite"),
    ("params-negative", ["plan", "--params=-5"], {}, 2, "positive"),
    ("params-zero", ["plan", "--params", "0"], {}, 2, "positive"),
    ("params-half", ["plan", "--params", "0.5"], {}, 2, "at least 1"),
    ("params-text", ["plan", "--params", "abc"], {}, 2, "cannot read"),
    ("params-bad-suffix", ["plan", "--params", "7Q"], {}, 2, "cannot read"),
    ("params-empty", ["plan", "--params", ""], {}, 2, "empty"),
    ("params-too-many", ["plan", "--params", "1e16"], {}, 2, "16 PB"),
    # below a Llama-like model's own embeddings and one layer (4,161,728 at the default 32,000-token vocabulary)
    ("params-one", ["plan", "--params", "1"], {}, 2, "give at least 4,161,728"),
    ("params-below-its-hidden-size", ["plan", "--params", "1e8", "--hidden-size", "8192"], {}, 2, "--hidden-size"),
    ("params-and-model", ["plan", "tiny-llama", *P], {}, 2, "not both"),
    ("shape-beside-a-model", ["plan", "tiny-llama", "--hidden-size", "1024"], {}, 2, "config fixes its shapes"),
    ("heads-beside-a-model", ["plan", "tiny-llama", "--num-kv-heads", "2"], {}, 2, "drop --num-kv-heads"),
    ("heads-not-dividing", ["plan", *P, "--hidden-size", "4096", "--num-attention-heads", "30"], {}, 2,
     "does not divide --hidden-size 4096"),
    ("kv-heads-not-dividing", ["plan", *P, "--hidden-size", "4096", "--num-attention-heads", "32",
                               "--num-kv-heads", "5"], {}, 2, "--num-kv-heads 5 does not divide"),
    ("heads-without-width", ["plan", *P, "--num-attention-heads", "32"], {}, 2, "give --hidden-size too"),
    ("no-model", ["plan"], {}, 2, "no model"),
    ("hidden-size-3", ["plan", *P, "--hidden-size", "3"], {}, 2, "--hidden-size"),
    ("hidden-size-0", ["plan", *P, "--hidden-size", "0"], {}, 2, "positive"),
    ("hidden-size-huge", ["plan", *P, "--hidden-size", "99999999999"], {}, 2, "--hidden-size"),
    ("layers-million", ["plan", *P, "--num-layers", "1000000"], {}, 2, "--num-layers"),
    ("vocab-beyond-int32", ["plan", *P, "--vocab-size", "3000000000"], {}, 2, "int32"),
    # ---- workload numbers
    ("epochs-inf", ["plan", *P, "--epochs", "inf"], {}, 2, "--epochs"),
    ("epochs-nan", ["plan", *P, "--epochs", "nan"], {}, 2, "--epochs"),
    ("epochs-zero", ["plan", *P, "--epochs", "0"], {}, 2, "--epochs"),
    ("epochs-negative", ["plan", *P, "--epochs=-1"], {}, 2, "--epochs"),
    ("epochs-text", ["plan", *P, "--epochs", "many"], {}, 2, "--epochs"),
    ("seq-len-zero", ["plan", *P, "--seq-len", "0"], {}, 2, "--seq-len"),
    ("seq-len-float", ["plan", *P, "--seq-len", "2.5"], {}, 2, "--seq-len"),
    ("seq-len-beyond-2-53", ["plan", *P, "--seq-len", "99999999999999999999"], {}, 2, "--seq-len"),
    # a learned position table (GPT-2's wpe): a longer sequence is an index error; rotary models only warn (issue 28)
    ("seq-len-past-positions", ["plan", "tiny-gpt2", "--seq-len", "100000"], {}, 2, "maximum of 512"),
    ("seq-len-max-nothing-fits", ["plan", "llama-3-70b", "--gpu", "t4", "--seq-len", "max", "--stage", "0"], {},
     1, "nothing fits even at 1 token"),
    ("seq-len-neither-number-nor-max", ["plan", *P, "--seq-len", "most"], {}, 2, "--seq-len"),
    ("seq-len-max-with-compare-gpus", ["plan", *P, "--seq-len", "max", "--compare-gpus", "h100-80gb,a100-80gb"], {},
     2, "--seq-len max"),
    ("check-seq-len-max-without-model", ["check", "c.json", "--gpus-per-node", "2", "--seq-len", "max"],
     {"c.json": ds()}, 2, "--model"),
    ("launch-seq-len-max", ["launch", "--model", "tiny-llama", "--gpu", "cpu", "--gpus-per-node", "2", "--seq-len",
                            "max", "--plan", "--output-dir", "run"], {}, 2, "answered by plan and check"),
    ("global-batch-zero", ["plan", *P, "--global-batch", "0"], {}, 2, "--global-batch"),
    # the cluster's links (issue 27): a positive number of GB/s per GPU, or one line
    ("inter-node-bandwidth-negative", ["plan", *P, "--nodes", "2", "--inter-node-bandwidth=-3"], {}, 2,
     "--inter-node-bandwidth"),
    ("inter-node-bandwidth-text", ["plan", *P, "--nodes", "2", "--inter-node-bandwidth", "infiniband"], {}, 2,
     "--inter-node-bandwidth"),
    ("intra-node-bandwidth-infinite", ["plan", *P, "--intra-node-bandwidth", "inf"], {}, 2, "--intra-node-bandwidth"),
    ("sequence-parallel-across-part-of-a-node", ["plan", *P, "--gpus-per-node", "8", "--nodes", "2",
                                                 "--sequence-parallel", "12"], {}, 2, "nor spans whole nodes"),
    ("samples-negative", ["plan", *P, "--samples=-3"], {}, 2, "--samples"),
    ("global-batch-indivisible", ["plan", *P, "--gpus-per-node", "8", "--global-batch", "12"], {}, 2, "divisible"),
    # ---- setup pins
    ("stage-5", ["plan", *P, "--stage", "5"], {}, 2, "--stage"),
    ("precision-fp8", ["plan", *P, "--precision", "fp8"], {}, 2, "--precision"),
    ("micro-batch-zero", ["plan", *P, "--micro-batch", "0"], {}, 2, "--micro-batch"),
    ("grad-accum-text", ["plan", *P, "--grad-accum", "x"], {}, 2, "--grad-accum"),
    ("offload-gpu", ["plan", *P, "--offload-optimizer", "gpu"], {}, 2, "--offload-optimizer"),
    ("fp16-on-cpu", ["plan", *P, "--gpu", "cpu", "--precision", "fp16"], {}, 2, "fp16"),
    ("bf16-on-v100", ["plan", *P, "--gpu", "v100-32gb", "--precision", "bf16"], {}, 2, "bf16"),
    ("memory-fraction-above-1", ["plan", *P, "--memory-fraction", "1.5"], {}, 2, "--memory-fraction"),
    ("memory-fraction-zero", ["plan", *P, "--memory-fraction", "0"], {}, 2, "--memory-fraction"),
    ("memory-fraction-nan", ["plan", *P, "--memory-fraction", "nan"], {}, 2, "--memory-fraction"),
    ("attention-bogus", ["plan", *P, "--attention", "bogus"], {}, 2, "--attention"),
    ("flash3-on-a100", ["plan", *P, "--gpu", "a100-80gb", "--attention", "flash3"], {}, 2, "runs on Hopper GPUs"),
    ("flash3-on-cpu", ["plan", *P, "--gpu", "cpu", "--attention", "flash3"], {}, 2, "runs on Hopper GPUs"),
    ("doc-len-zero", ["plan", *P, "--attention", "flash", "--doc-len", "0"], {}, 2, "--doc-len"),
    ("doc-len-with-sdpa", ["plan", *P, "--doc-len", "512"], {}, 2, "use --attention flash or flash3"),
    ("doc-len-past-the-sequence", ["plan", *P, "--attention", "flash", "--seq-len", "1024", "--doc-len", "2048"], {}, 2,
     "longer than the 1024-token sequence"),
    # ---- hardware
    ("gpu-empty", ["plan", *P, "--gpu", ""], {}, 2, "--gpu"),
    ("gpu-unknown", ["plan", *P, "--gpu", "h999"], {}, 2, "unknown GPU"),
    ("gpus-per-node-billion", ["plan", *P, "--gpus-per-node", "1000000000"], {}, 2, "1024"),
    ("gpus-per-node-zero", ["plan", *P, "--gpus-per-node", "0"], {}, 2, "positive"),
    ("gpus-per-node-float", ["plan", *P, "--gpus-per-node", "2.5"], {}, 2, "--gpus-per-node"),
    ("nodes-zero", ["plan", *P, "--nodes", "0"], {}, 2, "--nodes"),
    ("nodes-too-many", ["plan", *P, "--nodes", "2000000"], {}, 2, "--nodes"),
    ("world-too-large", ["plan", *P, "--gpus-per-node", "1024", "--nodes", "2000"], {}, 2, "world size"),
    ("gpu-memory-overflow", ["plan", *P, "--gpu-memory", "1e400GB"], {}, 2, "finite"),
    ("gpu-memory-negative", ["plan", *P, "--gpu-memory=-80GB"], {}, 2, "negative"),
    ("gpu-memory-unit", ["plan", *P, "--gpu-memory", "80XB"], {}, 2, "unit"),
    ("gpu-memory-zero", ["plan", *P, "--gpu-memory", "0"], {}, 2, "positive"),
    ("gpu-memory-exabytes", ["plan", *P, "--gpu-memory", "2000PB"], {}, 2, "unit"),
    ("gpu-memory-beyond-eib", ["plan", *P, "--gpu-memory", "2000000TB"], {}, 2, "1 EiB"),
    ("gpu-memory-empty", ["plan", *P, "--gpu-memory", ""], {}, 2, "empty"),
    ("gpu-memory-no-unit", ["plan", *P, "--gpu-memory", "80"], {}, 2, "has no unit, so it reads as 80 bytes"),
    ("cpu-memory-no-unit", ["plan", *P, "--cpu-memory", "429.5"], {}, 2, "e.g. 429.5GB or 429.5GiB"),
    ("cpu-memory-text", ["plan", *P, "--cpu-memory", "lots"], {}, 2, "--cpu-memory"),
    ("nvme-size-negative", ["plan", *P, "--nvme-size=-1GB"], {}, 2, "negative"),
    ("nvme-path-missing", ["plan", *P, "--nvme-path", "/nonexistent/nvme"], {}, 2, "--nvme-path"),
    ("profile-missing", ["plan", *P, "--hardware-profile", "nope.json"], {}, 2, "does not exist"),
    ("profile-not-json", ["plan", *P, "--hardware-profile", "p.json"], {"p.json": "{nope"}, 2, "not valid JSON"),
    ("profile-nan", ["plan", *P, "--hardware-profile", "p.json"], {"p.json": '{"a": NaN}'}, 2, "NaN"),
    ("dist-backend-unknown", ["plan", *P, "--dist-backend", "nccl2"], {}, 2, "invalid choice"),
    ("dist-backend-nccl-on-cpu", ["check", "c.json", *P, "--gpu", "cpu", "--dist-backend", "nccl"], {"c.json": ds()}, 2,
     "use gloo on CPU"),
    ("dist-backend-ccl-on-gpu", ["render", *P, "--gpu", "a100-80gb", "--dist-backend", "ccl", "-o", "x.json"], {}, 2,
     "cannot carry"),
    # ---- hostfiles
    ("hostfile-missing", ["plan", *P, "--hostfile", "nope"], {}, 2, "does not exist"),
    ("hostfile-directory", ["plan", *P, "--hostfile", "d"], {"d/x": ""}, 2, "not a regular file"),
    ("hostfile-huge-slots", ["plan", *P, "--hostfile", "h"], {"h": "w0 slots=100000000000000000000\n"}, 2, "1024"),
    ("hostfile-zero-slots", ["plan", *P, "--hostfile", "h"], {"h": "w0 slots=0\n"}, 2, "positive"),
    ("hostfile-word-slots", ["plan", *P, "--hostfile", "h"], {"h": "w0 slots=two\n"}, 2, "slots=N"),
    ("hostfile-glued-slots", ["plan", *P, "--hostfile", "h"], {"h": "w0 slots=4abc\n"}, 2, "whole number"),
    ("hostfile-empty", ["plan", *P, "--hostfile", "h"], {"h": "# nobody\n"}, 2, "no hosts"),
    ("hostfile-duplicate", ["plan", *P, "--hostfile", "h"], {"h": "w0 slots=2\nw0 slots=2\n"}, 2, "again"),
    ("hostfile-at-in-name", ["plan", *P, "--hostfile", "h"], {"h": "a@b slots=2\n"}, 2, "'@'"),
    ("hostfile-unequal", ["plan", *P, "--hostfile", "h"], {"h": "w0 slots=2\nw1 slots=4\n"}, 2, "same slots"),
    ("hostfile-disagrees", ["plan", *P, "--hostfile", "h", "--gpus-per-node", "4"], {"h": "w0 slots=2\n"}, 2, "disagrees"),
    ("hostfile-binary", ["plan", *P, "--hostfile", "h"], {"h": b"\xff\xfe\x00"}, 2, "UTF-8"),
    ("hostfile-newline-name", ["plan", *P, "--hostfile", "h\nx"], {}, 2, "\\n"),
    # ---- model configs
    ("model-missing-dir", ["plan", "./nope"], {}, 2, "does not exist"),
    ("model-dir-no-config", ["plan", "./m"], {"m/weights.txt": "x"}, 2, "config.json"),
    ("model-vocab-zero", ["plan", "./m"], {"m/config.json": model_config(vocab_size=0)}, 2, "vocab_size"),
    ("model-trillion-layers", ["plan", "./m"], {"m/config.json": model_config(num_hidden_layers=10**12)}, 2, "10,000"),
    ("model-string-size", ["plan", "./m"], {"m/config.json": model_config(hidden_size="64")}, 2, "hidden_size"),
    ("model-bool-size", ["plan", "./m"], {"m/config.json": model_config(intermediate_size=True)}, 2, "intermediate_size"),
    ("model-huge-product", ["plan", "./m"], {"m/config.json": model_config(hidden_size=2**24, num_attention_heads=2**10)},
     2, "16 PB"),
    ("model-nested-text-layers", ["plan", "./m"], {"m/config.json": json.dumps(
        {"model_type": "gemma3", "text_config": {"num_hidden_layers": 10**9, "vocab_size": 262208}})}, 2,
     "(text_config): num_hidden_layers"),
    ("model-heads-not-dividing", ["plan", "./m"], {"m/config.json": model_config(num_attention_heads=3,
                                                                               num_key_value_heads=3)}, 2,
     "not divisible by num_attention_heads 3"),
    ("model-no-type", ["plan", "./m"], {"m/config.json": json.dumps({"hidden_size": 64})}, 2, "model_type"),
    ("model-list-type", ["plan", "./m"], {"m/config.json": model_config(model_type=[])}, 2, "model_type"),
    ("model-unknown-type", ["plan", "./m"], {"m/config.json": model_config(model_type="made-up")}, 2, "made-up"),
    ("model-not-json", ["plan", "./m"], {"m/config.json": "{"}, 2, "not valid JSON"),
    ("model-nan", ["plan", "./m"], {"m/config.json": model_config()[:-1] + ', "rope_theta": NaN}'}, 2, "NaN"),
    ("model-deep", ["plan", "./m"], {"m/config.json": '{"a": ' * 5000 + "1" + "}" * 5000}, 2, "nests"),
    ("model-array", ["plan", "./m"], {"m/config.json": "[1, 2]"}, 2, "object"),
    ("model-config-file-missing", ["plan", "./c/config.json"], {"c/x": ""}, 2, "config.json"),
    # ---- plan --plot (refused before planning)
    ("plot-pdf", ["plan", *P, "--plot", "m.pdf"], {}, 2, ".svg or .png"),
    ("plot-no-extension", ["plan", *P, "--plot", "m"], {}, 2, ".svg or .png"),
    # a folder that does not exist is created (mkdir -p: test_every_writer_creates_missing_folders); under a file, none can
    ("plot-under-a-file", ["plan", *P, "--plot", "f/nope/m.svg"], {"f": "x"}, 2, "cannot create"),
    ("plot-is-dir", ["plan", *P, "--plot", "d.svg"], {"d.svg/x": ""}, 2, "folder"),
    ("plot-empty", ["plan", *P, "--plot", ""], {}, 2, "empty"),
    # ---- render
    ("render-output-empty", ["render", *P, "-o", ""], {}, 2, "empty"),
    ("render-output-under-a-file", ["render", *P, "-o", "f/nope/ds.json"], {"f": "x"}, 2, "cannot create"),
    ("render-accelerate-under-a-file", ["render", *P, "--profile", "accelerate", "-o", "f/ds.json"], {"f": "x"}, 2,
     "cannot create"),
    ("render-output-is-dir", ["render", *P, "-o", "d"], {"d/x": ""}, 2, "d"),
    ("render-profile-bogus", ["render", *P, "--profile", "bogus"], {}, 2, "--profile"),
    ("render-accelerate-to-a-dir", ["render", *P, "--profile", "accelerate", "-o", "d"], {"d/x": ""}, 2, "d"),
    ("render-accelerate-to-stdout", ["render", *P, "--profile", "accelerate", "-o", "-"], {}, 2, "-o FILE"),
    ("render-seq-past-positions", ["render", "tiny-gpt2", "--seq-len", "4096"], {}, 2, "maximum"),
    # ---- check: the file
    ("check-missing", ["check", "nope.json", *CHECK], {}, 2, "does not exist"),
    ("check-empty-name", ["check", "", *CHECK], {}, 2, "empty"),
    ("check-directory", ["check", "d", *CHECK], {"d/x": ""}, 2, "folder"),
    ("check-not-json", ["check", "c.json", *CHECK], {"c.json": "{nope"}, 2, "not valid JSON"),
    ("check-array", ["check", "c.json", *CHECK], {"c.json": "[]"}, 2, "not an object"),
    ("check-binary", ["check", "c.json", *CHECK], {"c.json": b"\xff\xfe{}"}, 2, "UTF-8"),
    ("check-nan", ["check", "c.json", *CHECK], {"c.json": ds()[:-1] + ', "gradient_clipping": NaN}'}, 2, "NaN"),
    ("check-infinity", ["check", "c.json", *CHECK], {"c.json": ds()[:-1] + ', "gradient_clipping": Infinity}'}, 2,
     "Infinity"),
    ("check-duplicate-key", ["check", "c.json", *CHECK], {"c.json": '{"train_batch_size": 8, "train_batch_size": 8}'},
     2, "twice"),
    ("check-deep", ["check", "c.json", *CHECK], {"c.json": '{"a": ' * 3000 + "1" + "}" * 3000}, 2, "nests"),
    # ---- check: block types DeepSpeed cannot read
    ("check-optimizer-list", ["check", "c.json", *CHECK], {"c.json": ds(optimizer=["AdamW"])}, 2, "optimizer"),
    ("check-scheduler-null", ["check", "c.json", *CHECK], {"c.json": ds(scheduler=None)}, 2, "scheduler"),
    ("check-activation-checkpointing-null", ["check", "c.json", *CHECK], {"c.json": ds(activation_checkpointing=None)},
     2, "activation_checkpointing"),
    ("check-comm-dtype-false", ["check", "c.json", *CHECK], {"c.json": ds(communication_data_type=False)}, 2,
     "communication_data_type"),
    ("check-comm-dtype-fp77", ["check", "c.json", *CHECK], {"c.json": ds(communication_data_type="fp77")}, 2,
     "communication_data_type"),
    ("check-zero-auto", ["check", "c.json", *CHECK], {"c.json": ds(zero_optimization="auto")}, 2, "zero_optimization"),
    ("check-bucket-string", ["check", "c.json", *CHECK], {"c.json": zero(reduce_bucket_size="big")}, 2,
     "reduce_bucket_size"),
    ("check-stage-7", ["check", "c.json", *CHECK], {"c.json": zero(stage=7)}, 2, "stage"),
    ("check-offload-gpu", ["check", "c.json", *CHECK], {"c.json": zero(offload_optimizer={"device": "gpu"})}, 2, "device"),
    ("check-timers-int", ["check", "c.json", *CHECK], {"c.json": ds(timers={"throughput": 5})}, 2, "timers"),
    ("check-allreduce-op", ["check", "c.json", *CHECK], {"c.json": ds(gradient_allreduce_op=3)}, 2,
     "gradient_allreduce_op"),
    ("check-batch-list", ["check", "c.json", *CHECK], {"c.json": ds(train_batch_size=[8])}, 2, "train_batch_size"),
    ("check-batch-mismatch", ["check", "c.json", *CHECK], {"c.json": ds(train_batch_size=7)}, 2, "train_batch_size"),
    ("check-batch-float", ["check", "c.json", *CHECK], {"c.json": ds(train_micro_batch_size_per_gpu=2.5)}, 2,
     "train_micro_batch_size_per_gpu"),
    ("check-typo-key", ["check", "c.json", *CHECK], {"c.json": ds(train_batch_sise=8)}, 2, "train_batch_sise"),
    ("check-aio-in-zero", ["check", "c.json", *CHECK], {"c.json": zero(aio={})}, 2, "aio"),
    ("check-fp16-key-in-bf16", ["check", "c.json", *CHECK], {"c.json": ds(bf16={"enabled": True, "loss_scale": 0})}, 2,
     "loss_scale"),
    ("check-fp16-key-in-legacy-bfloat16", ["check", "c.json", *CHECK],
     {"c.json": ds(bfloat16={"enabled": True, "loss_scale": 0})}, 2, "loss_scale"),
    ("check-legacy-bfloat16-on-v100", ["check", "c.json", *P, "--gpus-per-node", "2", "--gpu", "v100-32gb"],
     {"c.json": ds(bfloat16={"enabled": True})}, 2, "does not support bf16"),
    ("check-legacy-bfloat16-and-fp16", ["check", "c.json", *CHECK],
     {"c.json": ds(bfloat16={"enabled": True}, fp16={"enabled": True})}, 2, "both enabled"),
    ("check-micro-batch-zero", ["check", "c.json", *CHECK, "--micro-batch", "0"], {"c.json": ds()}, 2, "--micro-batch"),
    ("check-precision-fp8", ["check", "c.json", *CHECK, "--precision", "fp8"], {"c.json": ds()}, 2, "--precision"),
    ("check-precision-unsupported", ["check", "c.json", *P, "--gpu", "v100-32gb", "--precision", "bf16"],
     {"c.json": ds(bf16={"enabled": "auto"})}, 2, "does not support bf16"),
    ("check-precision-disagrees", ["check", "c.json", *CHECK, "--precision", "fp16"], {"c.json": ds()}, 2,
     "disagrees"),
    ("check-model-seq-past-positions", ["check", "c.json", "--model", "tiny-gpt2", "--seq-len", "100000"],
     {"c.json": ds()}, 2, "maximum"),
    ("check-model-and-params", ["check", "c.json", "--model", "tiny-llama", *P], {"c.json": ds()}, 2, "not both"),
    # ---- launch (all refused before anything is written or started)
    ("launch-no-model", ["launch", "--plan"], {}, 2, "--model"),
    ("launch-no-plan-or-config", ["launch", "--model", "tiny-llama"], {}, 2, "--plan"),
    ("launch-model-empty", ["launch", "--model", "", "--plan"], {}, 2, "empty"),
    ("launch-data-missing", [*LAUNCH, "--plan", "--data", "nope.txt", "--output-dir", "run"], {}, 2, "does not exist"),
    ("launch-data-too-short", [*LAUNCH, "--plan", "--data", "d.txt", "--output-dir", "run"], {"d.txt": "short"}, 2,
     "fewer than one sequence"),
    ("launch-data-bad-jsonl", [*LAUNCH, "--plan", "--data", "d.jsonl", "--output-dir", "run"],
     {"d.jsonl": '{"text": "ok"}\n{nope}\n'}, 2, "d.jsonl:2"),
    ("launch-data-csv", [*LAUNCH, "--plan", "--data", "d.csv", "--output-dir", "run"], {"d.csv": "a,b\n"}, 2, ".csv"),
    ("launch-data-no-expected-columns", [*LAUNCH, "--plan", "--data", "d.csv", "--output-dir", "run"],
     {"d.csv": "a,b\n1,2\n"}, 2, "has columns a, b, none of which"),
    ("launch-data-empty-json", [*LAUNCH, "--plan", "--data", "d.json", "--output-dir", "run"], {"d.json": "[]"}, 2,
     "no records"),
    ("launch-data-messages-not-a-list", [*LAUNCH, "--plan", "--data", "d.jsonl", "--output-dir", "run"],
     {"d.jsonl": '{"messages": "hello"}\n'}, 2, "not a list"),
    ("launch-data-no-chat-template", [*LAUNCH, "--plan", "--data", "d.jsonl", "--tokenizer", "tok", "--output-dir", "run"],
     {"d.jsonl": CHAT_RECORD, **NO_TEMPLATE_TOKENIZER}, 2, "no chat template"),
    ("launch-data-format-not-there", [*LAUNCH, "--plan", "--data", "d.txt", "--data-format", "chat", "--output-dir", "run"],
     {"d.txt": "plain text " * 20}, 2, "--data-format chat"),
    ("launch-data-format-unknown", [*LAUNCH, "--plan", "--data-format", "xml"], {}, 2, "invalid choice"),
    ("launch-packing-unknown", [*LAUNCH, "--plan", "--packing", "maybe"], {}, 2, "invalid choice"),
    ("launch-data-split-on-files", [*LAUNCH, "--plan", "--data", "d.txt", "--data-split", "test", "--output-dir", "run"],
     {"d.txt": "plain text " * 20}, 2, "--data-split"),
    ("launch-seq-past-positions", ["launch", "--model", "tiny-gpt2", "--gpu", "cpu", "--gpus-per-node", "2",
                                   "--seq-len", "100000", "--plan", "--output-dir", "run"], {}, 2, "maximum"),
    ("launch-output-is-file", [*LAUNCH, "--plan", "--output-dir", "f"], {"f": "x"}, 2, "is a file"),
    ("launch-resume-nothing", [*LAUNCH, "--plan", "--resume", "--output-dir", "run"], {}, 2, "--resume"),
    # a checkpoint of 2 ranks x micro 3 x accumulation 1 (global 6) resumed on 4 ranks of micro 2: cannot be held
    ("launch-resume-batch-not-split", [*LAUNCH, "--gpus-per-node", "4", "--config", "c.json", "--resume",
                                       "--output-dir", "run"],
     {"c.json": ds(train_batch_size=8), "run/checkpoints/latest": "step2",
      "run/checkpoints/step2/zerokit.json": json.dumps({"world_size": 2, "micro_batch": 3, "grad_accum": 1,
                                                       "zero_stage": 2, "precision": "fp32"})},
     2, "global batch 6 cannot be split"),
    ("launch-port-70000", [*LAUNCH, "--plan", "--master-port", "70000"], {}, 2, "--master-port"),
    ("launch-steps-zero", [*LAUNCH, "--plan", "--steps", "0"], {}, 2, "--steps"),
    ("launch-epochs-inf", ["launch", "--model", "tiny-llama", "--plan", "--epochs", "inf"], {}, 2, "--epochs"),
    ("launch-pin-with-config", [*LAUNCH, "--config", "c.json", "--stage", "3", "--output-dir", "run"],
     {"c.json": ds()}, 2, "--plan"),
    ("launch-config-invalid", [*LAUNCH, "--config", "c.json", "--output-dir", "run"],
     {"c.json": ds(optimizer=["AdamW"])}, 2, "optimizer"),
    ("launch-config-nan", [*LAUNCH, "--config", "c.json", "--output-dir", "run"],
     {"c.json": ds()[:-1] + ', "gradient_clipping": NaN}'}, 2, "NaN"),
    ("launch-nodes-without-hostfile", [*LAUNCH, "--plan", "--nodes", "2", "--output-dir", "run"], {}, 2, "--hostfile"),
    ("launch-pdsh-without-hostfile", [*LAUNCH, "--plan", "--launcher", "pdsh", "--output-dir", "run"], {}, 2,
     "--hostfile"),
    ("launch-slurm-without-addr", [*LAUNCH, "--plan", "--launcher", "slurm", "--output-dir", "run"], {}, 2,
     "--master-addr"),
    ("launch-sbatch-empty", [*LAUNCH, "--plan", "--sbatch", ""], {}, 2, "empty"),
    ("launch-sbatch-under-a-file", [*LAUNCH, "--plan", "--sbatch", "f/nope/job.sbatch", "--output-dir", "run"],
     {"f": "x"}, 2, "--sbatch"),
    ("launch-k8s-under-a-file", [*LAUNCH, "--plan", "--k8s", "f/job.yaml", "--k8s-image", "img", "--k8s-volume",
                                 "pvc:/tmp", "--output-dir", "run"], {"f": "x"}, 2, "--k8s"),
    ("launch-weights-without-tokenizer", [*LAUNCH, "--model", "./m", "--plan", "--output-dir", "run"],
     {"m/config.json": json.dumps(TINY), "m/model.safetensors": b""}, 2, "tokenizer"),
    # a backend this torch lacks (PyPI's CPU torch; tests/test_dist_backend.py asserts the build): before any rank
    ("launch-dist-backend-mpi-missing", [*LAUNCH, "--plan", "--dist-backend", "mpi", "--output-dir", "run"], {}, 2,
     "built without MPI"),
    ("launch-dist-backend-ccl-missing", [*LAUNCH, "--plan", "--dist-backend", "ccl", "--output-dir", "run"], {}, 2,
     "oneccl_bind_pt"),
    # ---- launch with the user's own script (after `--`)
    ("script-missing", [*LAUNCH, "--output-dir", "run", "--", "python", "train.py"], {}, 2, "does not exist"),
    ("script-no-ds-config", [*LAUNCH, "--output-dir", "run", "--", "python", "t.py", "--lr", "1"],
     {"t.py": "import deepspeed\n"}, 2, "{ds_config}"),
    ("script-own-config", [*LAUNCH, "--output-dir", "run", "--", "python", "t.py", "--deepspeed", "x.json"],
     {"t.py": "from transformers import TrainingArguments\n"}, 2, "--config"),
    ("script-torchrun", [*LAUNCH, "--output-dir", "run", "--", "torchrun", "t.py"], {"t.py": ""}, 2, "python SCRIPT"),
    ("script-nothing-after-dashes", [*LAUNCH, "--output-dir", "run", "--"], {}, 2, "--plan"),
    ("script-with-data", [*LAUNCH, "--data", "d.txt", "--output-dir", "run", "--", "python", "t.py", "{ds_config}"],
     {"t.py": ""}, 2, "--data"),
    ("script-samples-without-script", [*LAUNCH, "--plan", "--samples", "5"], {}, 2, "--samples"),
    # ---- fine-tuning (plan, render, check; launch's own rows are with the launch tests)
    ("lora-r-zero", ["plan", "tiny-llama", "--finetune", "lora", "--lora-r", "0"], {}, 2, "--lora-r must be at least 1"),
    ("lora-r-text", ["plan", "tiny-llama", "--finetune", "lora", "--lora-r", "x"], {}, 2, "--lora-r"),
    ("lora-targets-none-match", ["plan", "tiny-llama", "--finetune", "lora", "--lora-targets", "nope_proj"], {}, 2,
     "Linear modules are named"),
    ("lora-targets-empty", ["plan", "tiny-llama", "--finetune", "lora", "--lora-targets", ","], {}, 2, "empty"),
    ("lora-dropout-one", ["plan", "tiny-llama", "--finetune", "lora", "--lora-dropout", "1"], {}, 2, "--lora-dropout"),
    ("lora-alpha-zero", ["plan", "tiny-llama", "--finetune", "lora", "--lora-alpha", "0"], {}, 2, "--lora-alpha"),
    ("lora-option-without-lora", ["plan", "tiny-llama", "--lora-r", "8"], {}, 2, "needs --finetune lora"),
    ("quant-option-without-qlora", ["plan", "tiny-llama", "--finetune", "lora", "--bnb-4bit-quant-storage", "bf16"], {},
     2, "needs --finetune qlora"),
    ("freeze-matches-nothing", ["plan", "tiny-llama", "--freeze", "nothing_here"], {}, 2, "matches no parameter"),
    ("freeze-matches-everything", ["plan", "tiny-llama", "--freeze", "*"], {}, 2, "freezes every parameter"),
    ("freeze-empty", ["plan", "tiny-llama", "--freeze", ""], {}, 2, "empty"),
    ("freeze-with-lora", ["plan", "tiny-llama", "--finetune", "lora", "--freeze", "embed"], {}, 2, "--finetune full"),
    ("freeze-with-params", ["plan", *P, "--freeze", "embed"], {}, 2, "a bare --params count does not have"),
    ("sp-mode-fpdt", ["plan", "tiny-llama", "--sequence-parallel-mode", "fpdt"], {}, 2, "DeepSpeed's FPDT"),
    ("render-sp-mode-fpdt", ["render", "tiny-llama", "--sequence-parallel-mode", "fpdt", "-o", "x.json"], {}, 2,
     "zerokit does not plan it"),
    ("sp-mode-unknown", ["plan", "tiny-llama", "--sequence-parallel-mode", "ring"], {}, 2, "invalid choice: 'ring'"),
    ("finetune-unknown", ["plan", "tiny-llama", "--finetune", "dora"], {}, 2, "invalid choice"),
    ("render-lora-r-zero", ["render", "tiny-llama", "--finetune", "lora", "--lora-r", "0", "-o", "x.json"], {}, 2,
     "--lora-r"),
    ("check-finetune-without-model", ["check", "c.json", "--gpus-per-node", "2", "--finetune", "lora"],
     {"c.json": ds()}, 2, "give --model"),
    ("check-freeze-matches-nothing", ["check", "c.json", "--model", "tiny-llama", "--gpus-per-node", "2",
                                      "--freeze", "nothing_here"], {"c.json": ds()}, 2, "matches no parameter"),
    # ---- calibrate
    ("calibrate-output-empty", ["calibrate", "-o", ""], {}, 2, "empty"),
    ("calibrate-output-under-a-file", ["calibrate", "-o", "f/p.json"], {"f": "x"}, 2, "cannot create"),
    ("calibrate-unknown-option", ["calibrate", "--bogus"], {}, 2, "unrecognized"),
]


def _write(root: Path, files: dict) -> None:
    for rel, content in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)


def _tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@pytest.fixture(autouse=True)
def _own_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("ZEROKIT_CACHE_DIR", str(tmp_path_factory.mktemp("bad-input-cache")))  # outside the workdir


def test_the_table_has_over_a_hundred_distinct_rows():
    assert len(ROWS) >= 100 and len({r[0] for r in ROWS}) == len(ROWS)
    commands = {argv[0] if argv and not argv[0].startswith("-") else "" for _, argv, *_ in ROWS}
    assert {"plan", "render", "check", "launch", "calibrate"} <= commands


@pytest.mark.parametrize("argv,files,code,needle", [r[1:] for r in ROWS], ids=[r[0] for r in ROWS])
def test_bad_input(argv, files, code, needle, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    _write(tmp_path, files)
    before = _tree(tmp_path)
    with pytest.raises(SystemExit) as exited:
        raise SystemExit(main([str(a) for a in argv]))
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert exited.value.code == code, (exited.value.code, out, err)
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert not EXCEPTION_NAME.search(lines[0]), lines[0]
    assert needle.lower() in lines[0].lower(), lines[0]
    assert out == "", out
    assert _tree(tmp_path) == before, "left on disk: " + ", ".join(sorted(set(_tree(tmp_path)) - set(before)))


# The library's boundary: zerokit's functions called from Python with what the CLI never passes them. (id, module,
# function, arguments, text the ZerokitError contains); each used to raise ZeroDivisionError, AttributeError or
# TypeError from inside.
NOT_AN_OBJECT = {**GOOD_DS, "zero_optimization": "auto"}
LIBRARY_ROWS = [
    ("derive-batch-world-0", "zerokit.config.read", "derive_batch", (8, 2, None, 0), "world size"),
    ("batch-world-size-none", "zerokit.config.read", "batch_world_size", (GOOD_DS, None), "world size"),
    ("fill-auto-world-0", "zerokit.config.auto", "fill_auto", ({**GOOD_DS, "train_batch_size": "auto"}, None, 0),
     "world size"),
    ("lint-world-float", "zerokit.config.lint", "lint_config", (GOOD_DS, 2.5), "world size"),
    ("setup-world-0", "zerokit.config.setup", "setup_from_config", (GOOD_DS, 0), "world size"),
    ("verdict-world-0", "zerokit.config.check", "deepspeed_verdict", (GOOD_DS, 0, None, None, None), "world size"),
    ("validate-world-0", "zerokit.config.validate", "validate_with_deepspeed", (GOOD_DS, 0), "world size"),
    ("setup-zero-string", "zerokit.config.setup", "setup_from_config", (NOT_AN_OBJECT, 2), "zero_optimization"),
    ("setup-zero-integer", "zerokit.config.setup", "setup_from_config", ({**GOOD_DS, "zero_optimization": 3}, 2),
     "zero_optimization"),
    ("setup-config-list", "zerokit.config.setup", "setup_from_config", ([], 2), "not an object"),
    ("lint-config-none", "zerokit.config.lint", "lint_config", (None, 2), "not an object"),
    ("fill-auto-config-string", "zerokit.config.auto", "fill_auto", ("{}", None, 2), "not an object"),
    ("auto-keys-config-list", "zerokit.config.auto", "auto_keys", ([1],), "not an object"),
    ("optimizer-of-config-int", "zerokit.config.setup", "optimizer_of", (3,), "not an object"),
    ("parallelism-config-none", "zerokit.config.read", "parallelism_from_config", (None,), "not an object"),
    ("cluster-gpus-float", "zerokit.spec.hardware", "Cluster", (None, 2.5), "whole numbers"),
    ("cluster-nodes-none", "zerokit.spec.hardware", "Cluster", (None, 1, None), "whole numbers"),
    ("spec-from-params-one", "zerokit.spec.model", "spec_from_params", (1,), "at least 4,161,728"),
]


@pytest.mark.parametrize("module,name,args,needle", [r[1:] for r in LIBRARY_ROWS], ids=[r[0] for r in LIBRARY_ROWS])
def test_library_bad_input(module, name, args, needle, tmp_path, monkeypatch):
    import importlib

    from zerokit.core.errors import ZerokitError

    monkeypatch.setenv("ZEROKIT_CACHE_DIR", str(tmp_path))
    if name == "Cluster":  # an accelerator first: the Cluster's own argument
        from zerokit.spec.hardware import accelerator

        args = (accelerator("a100-80gb"), *args[1:])
    with pytest.raises(ZerokitError) as refused:
        getattr(importlib.import_module(module), name)(*args)
    message = str(refused.value)
    assert "\n" not in message and needle in message and not EXCEPTION_NAME.search(message), message


# transformers' own tests/deepspeed/ds_config_zero3_bf16.json, copied unchanged (the Trainer's "auto" pattern, the
# old block name); tests/test_fuzz.py seeds with it too
TRANSFORMERS_ZERO3_BF16 = json.loads((Path(__file__).parent / "data" / "user_configs" /
                                      "transformers_ds_config_zero3_bf16.json").read_text())


@pytest.mark.parametrize("block,precision", [({"enabled": "auto"}, "bf16"), ({"enabled": True}, "bf16"),
                                             ({"enabled": False}, "fp32")])
def test_legacy_bfloat16_block_is_read_as_deepspeed_reads_it(block, precision, tmp_path, monkeypatch, capsys):
    """Not bad input: DeepSpeed reads "bfloat16" as the bf16 block where "bf16" is absent (get_bfloat16_config,
    BFLOAT16_OLD). `check` accepts it (exit 0) in the precision DeepSpeed would run, and warns of the newer name."""
    pytest.importorskip("deepspeed")
    monkeypatch.chdir(tmp_path)
    config = {**TRANSFORMERS_ZERO3_BF16, "bfloat16": block}
    (tmp_path / "c.json").write_text(json.dumps(config))
    pin = [] if block["enabled"] == "auto" else ["--precision", precision]
    rc = main(["check", "c.json", *CHECK, *pin])
    out, err = capsys.readouterr()
    assert rc == 0, out + err
    assert "bfloat16: the old name of the bf16 block" in out and f" {precision} mb=" in out, out
    from zerokit.config.setup import setup_from_config

    concrete = {"train_micro_batch_size_per_gpu": 1, "bfloat16": block, "zero_optimization": {"stage": 2}}
    if block["enabled"] != "auto":
        assert setup_from_config(concrete, 2)[0].precision == precision


WRITERS = [  # (id, argv, the files it writes): every option naming a file zerokit writes (core/options.py)
    ("render", ["render", *P, "-o", "a/b/ds.json"], ["a/b/ds.json"]),
    ("render-accelerate", ["render", *P, "--profile", "accelerate", "-o", "a/b/ds.json"],
     ["a/b/ds.json", "a/b/accelerate_config.yaml"]),
    ("plot", ["plan", *P, "--plot", "a/b/m.svg"], ["a/b/m.svg"]),
    ("sbatch", [*LAUNCH, "--plan", "--sbatch", "a/b/job.sbatch", "--output-dir", "run"], ["a/b/job.sbatch"]),
    ("k8s", [*LAUNCH, "--plan", "--k8s", "a/b/job.yaml", "--k8s-image", "img", "--k8s-volume", "pvc:{cwd}",
             "--output-dir", "run"], ["a/b/job.yaml"]),
]


@pytest.mark.parametrize("argv,written", [w[1:] for w in WRITERS], ids=[w[0] for w in WRITERS])
def test_every_writer_creates_missing_folders(argv, written, tmp_path, monkeypatch, capsys):
    """-o / --plot / --sbatch / --k8s into folders that do not exist: created as `mkdir -p` does, the same for every
    writer (calibrate -o: tests/test_calibrate.py and test_atomic_write_makes_folders_and_removes_them_on_failure)."""
    if "--plot" in argv:
        pytest.importorskip("matplotlib")
    monkeypatch.chdir(tmp_path)
    rc = main([str(a).format(cwd=tmp_path) for a in argv])
    err = capsys.readouterr().err
    assert rc == 0, err
    assert all((tmp_path / w).is_file() for w in written), sorted(_tree(tmp_path))


def test_atomic_write_makes_folders_and_removes_them_on_failure(tmp_path, monkeypatch):
    """The one writer below every file zerokit writes: folders made as mkdir -p, and gone again if the write fails
    (nothing half-written); check_writable_file refuses beforehand what cannot be made, and makes nothing."""
    import os

    from zerokit.core import fsutil
    from zerokit.core.errors import ZerokitError

    assert fsutil.check_writable_file(tmp_path / "x" / "y" / "p.json", "-o p.json") and not (tmp_path / "x").exists()
    fsutil.atomic_write_text(tmp_path / "x" / "y" / "p.json", "{}")
    assert (tmp_path / "x" / "y" / "p.json").read_text() == "{}"

    def no_space(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", no_space)
    with pytest.raises(OSError):
        fsutil.atomic_write_text(tmp_path / "u" / "v" / "p.json", "{}")
    monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x"]
    (tmp_path / "f").write_text("")
    for bad, needle in ((tmp_path / "f" / "g" / "p.json", "cannot create"), (tmp_path / "x", "is a folder")):
        with pytest.raises(ZerokitError, match=needle):
            fsutil.check_writable_file(bad, "-o")


def _zk(*args, cache: Path, extra_env: dict | None = None):
    import os
    import subprocess
    import sys

    env = dict(os.environ, ZEROKIT_CACHE_DIR=str(cache), PYTHONPATH=str(REPO), **(extra_env or {}))
    env.pop("DS_ACCELERATOR", None)  # DeepSpeed then detects the accelerator and warns on import, as users see it
    return subprocess.run([sys.executable, "-m", "zerokit", *args], capture_output=True, text=True, env=env,
                          cwd=str(cache.parent), timeout=300)


def test_quiet_by_default_and_verbose_on_request(tmp_path):
    """A check that imports DeepSpeed (fresh cache) prints its table on stdout and nothing on stderr; `-v` lets
    DeepSpeed's own import warning through, on stderr, leaving stdout as it was."""
    pytest.importorskip("deepspeed")
    (tmp_path / "c.json").write_text(ds())
    small = ["--params", "1e8", "--gpus-per-node", "2", "--gpu", "a100-80gb"]  # fits: exit 0
    quiet = _zk("check", str(tmp_path / "c.json"), *small, cache=tmp_path / "cache-a")
    loud = _zk("-v", "check", str(tmp_path / "c.json"), *small, cache=tmp_path / "cache-b")
    assert quiet.returncode == loud.returncode == 0, quiet.stderr + loud.stderr
    assert quiet.stderr == "" and "accept it" in quiet.stdout, quiet.stderr
    assert "accelerator" in loud.stderr.lower() and loud.stdout == quiet.stdout, loud.stderr


def test_hub_id_offline_is_one_quiet_line(tmp_path):
    """A hub id that cannot be fetched: one line, none of the hub client's own output (HF_HUB_OFFLINE: no network
    is tried, as on a machine without internet)."""
    pytest.importorskip("huggingface_hub")
    r = _zk("plan", "some-org/not-cached-model", "--gpu", "a100-80gb", cache=tmp_path / "cache",
            extra_env={"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")})
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    assert "hub" in lines[0] and not EXCEPTION_NAME.search(lines[0]) and r.stdout == "", lines[0]


def test_setup_on_a_full_disk_is_one_line_before_it_writes_anything(tmp_path):
    """scripts/setup.sh checks the free space before it makes the venv: a full disk was pip's traceback
    ("[Errno 28] No space left on device") halfway through an install, the venv half-written."""
    import shutil
    import subprocess

    repo = Path(__file__).resolve().parent.parent
    (tmp_path / "scripts").mkdir()
    shutil.copy(repo / "scripts" / "setup.sh", tmp_path / "scripts" / "setup.sh")
    for name in ("pyproject.toml", "constraints-cpu.txt"):
        shutil.copy(repo / name, tmp_path / name)
    shim = tmp_path / "bin"
    shim.mkdir()
    # df -Pk as coreutils prints it, with 1 GiB available (setup needs 4 for a fresh venv)
    (shim / "df").write_text("#!/bin/sh\necho 'Filesystem 1024-blocks Used Available Capacity Mounted on'\n"
                             "echo '/dev/vda 263174212 262125636 1048576 100% /'\n")
    (shim / "df").chmod(0o755)
    env = {**os.environ, "PATH": f"{shim}:{os.environ['PATH']}", "TMPDIR": str(tmp_path)}
    out = subprocess.run(["bash", "scripts/setup.sh"], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 2, out.stderr
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("setup: 1024 MiB free on ") and "needs about 4 GiB" in last and "rerun" in last
    assert "Traceback" not in out.stderr and not (tmp_path / ".venv").exists()
