"""Ulysses in DeepSpeed's engine reduces gradients in seq_parallel_communication_data_type (engine.py: set once the
sequence-parallel group exists, whatever communication_data_type says; default fp32, runtime/constants.py), and ZeRO-3
casts each reduced gradient to it (stage3.py __avg_scatter_grads). What zerokit prices of it (the traffic, the copies
of one reduction), renders, reads back and pins for sources whose SP runs outside the engine. The real 2-rank launches
that measure the copies are in tests/test_long_context.py."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from zerokit.config.render import render_ds_config
from zerokit.config.setup import setup_from_config
from zerokit.core.errors import ZerokitError
from zerokit.estimate.memory import phase_terms, zero3_reduce_terms
from zerokit.estimate.timing import collective_bytes
from zerokit.planning.search import edge_bytes
from zerokit.spec.hardware import Cluster, accelerator
from zerokit.spec.model import spec_from_params
from zerokit.spec.setup import Workload, ZeroKnobs, ZeroSetup

LLAMA_8B = spec_from_params(8.03e9, hidden_size=4096, num_layers=32, vocab_size=128256)
H100x8 = Cluster(accelerator("h100-80gb"), gpus_per_node=8)


def test_the_engine_reduces_in_the_sequence_parallel_dtype_only_under_sp():
    sp = ZeroSetup(zero_stage=3, precision="bf16", sequence_parallel=8)
    assert sp.gradient_comm_precision == "fp32"  # DeepSpeed's default
    assert replace(sp, communication_data_type="bf16").gradient_comm_precision == "fp32"  # the engine overrides it
    assert replace(sp, seq_parallel_communication_data_type="bf16").gradient_comm_precision == "bf16"
    dp = ZeroSetup(zero_stage=3, precision="bf16")
    assert dp.gradient_comm_precision == "bf16"
    assert "comm=fp32" in sp.label and "comm" not in dp.label
    with pytest.raises(ZerokitError, match="seq_parallel_communication_data_type must be"):
        ZeroSetup(seq_parallel_communication_data_type="int8")
    with pytest.raises(ZerokitError, match="seq_parallel_communication_data_type must be"):
        ZeroSetup(seq_parallel_communication_data_type=None)  # the engine always has one under SP


def test_fp32_gradients_move_twice_the_bytes_of_bf16():
    sp = ZeroSetup(zero_stage=3, precision="bf16", sequence_parallel=8)
    fp32 = collective_bytes(LLAMA_8B, H100x8, sp)
    bf16 = collective_bytes(LLAMA_8B, H100x8, replace(sp, seq_parallel_communication_data_type="bf16"))
    assert fp32.gradients == pytest.approx(2 * bf16.gradients)
    assert fp32.parameters == bf16.parameters  # gathered in their own dtype


def test_one_reduction_of_the_head_casts_it_to_fp32_on_the_gpu():
    """Llama-3.1-8B's untied head (128,256 x 4,096 = 525M elements) is beyond the h^2 reduce bucket, so it goes alone:
    its bf16 gradient and, under SP, a 4-byte copy; 525M divides by 8 ranks, so reduce_scatter_coalesced flattens
    nothing (over 5 it pads, into a flat copy); no gloo copy on a GPU."""
    k = 128256 * 4096
    knobs = ZeroKnobs.for_model(LLAMA_8B)
    sp = ZeroSetup(zero_stage=3, precision="bf16", sequence_parallel=8)
    assert zero3_reduce_terms(LLAMA_8B, sp, knobs, 8, on_cpu=False) == {"reduce_gradient": 2 * k, "reduce_comm_cast": 4 * k}
    bf16 = replace(sp, seq_parallel_communication_data_type="bf16")
    assert zero3_reduce_terms(LLAMA_8B, bf16, knobs, 8, on_cpu=False) == {"reduce_gradient": 2 * k}
    assert zero3_reduce_terms(LLAMA_8B, bf16, knobs, 5, on_cpu=False) == {"reduce_gradient": 2 * k,
                                                                          "reduce_scatter_flat": 2 * k}
    assert zero3_reduce_terms(LLAMA_8B, sp, knobs, 8, on_cpu=True)["reduce_scatter_gloo_copy"] == 4 * k
    assert zero3_reduce_terms(LLAMA_8B, sp, knobs, 1, on_cpu=False) == {}


def test_the_reduction_is_a_phase_only_where_it_copies():
    """No phase for a bf16 reduction on GPUs (the gradient alone, below the logits' gradient that precedes it); under
    SP the phase holds the checkpoints, the gathered weights, the head's gradient and its fp32 copy."""
    wl = Workload(seq_len=32768)
    sp = ZeroSetup(zero_stage=3, precision="bf16", sequence_parallel=8, activation_checkpointing=True, tiled_loss=True)
    phases = phase_terms(LLAMA_8B, H100x8, sp, wl, ZeroKnobs.for_model(LLAMA_8B))
    assert phases["backward_reduce"]["reduce_comm_cast"] == 4 * 128256 * 4096
    assert "activations_checkpoints" in phases["backward_reduce"]
    bf16 = replace(sp, seq_parallel_communication_data_type="bf16")
    assert "backward_reduce" not in phase_terms(LLAMA_8B, H100x8, bf16, wl, ZeroKnobs.for_model(LLAMA_8B))


def test_render_writes_the_dtype_and_deepspeed_reads_it_back():
    """The key goes beside sequence_parallel_size; DeepSpeed's own reader (runtime/config.py
    get_communication_data_type) gives the dtype the plan priced, and check reads it into the same setup."""
    torch = pytest.importorskip("torch")
    from deepspeed.runtime import config as ds_config
    from deepspeed.runtime.constants import (SEQ_PARALLEL_COMMUNICATION_DATA_TYPE,
                                             SEQ_PARALLEL_COMMUNICATION_DATA_TYPE_DEFAULT)

    for dtype, expected in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        setup = ZeroSetup(zero_stage=3, precision="bf16", sequence_parallel=2, seq_parallel_communication_data_type=dtype)
        cfg = render_ds_config(setup, Cluster(accelerator("cpu"), gpus_per_node=2), LLAMA_8B)
        assert cfg["seq_parallel_communication_data_type"] == dtype
        got = ds_config.get_communication_data_type(cfg, SEQ_PARALLEL_COMMUNICATION_DATA_TYPE,
                                                    SEQ_PARALLEL_COMMUNICATION_DATA_TYPE_DEFAULT)
        assert got == expected
        assert setup_from_config(cfg, 2)[0].seq_parallel_communication_data_type == dtype
    plain = render_ds_config(ZeroSetup(zero_stage=3), Cluster(accelerator("cpu"), gpus_per_node=2), LLAMA_8B)
    assert "seq_parallel_communication_data_type" not in plain


def test_plan_takes_the_option_and_prices_it():
    from zerokit.api import plan

    common = dict(params=8e9, gpu="h100", gpus_per_node=8, seq_len=65536, sequence_parallel=8, stage=3)
    fp32 = plan(**common)
    bf16 = plan(**common, seq_parallel_comm_dtype="bf16")
    assert fp32.best.setup.seq_parallel_communication_data_type == "fp32"
    assert bf16.best.setup.seq_parallel_communication_data_type == "bf16"
    assert fp32.best.time.communication_seconds + fp32.best.time.communication_hidden_seconds > \
        bf16.best.time.communication_seconds + bf16.best.time.communication_hidden_seconds
    # the page's answer is the library's (zerokit serve's /api/plan, the form's "SP gradient dtype")
    from zerokit.serve.app import answer

    options = {k: str(v) for k, v in {**common, "seq_parallel_comm_dtype": "bf16"}.items()}
    status, _, body = answer("POST", "/api/plan", json.dumps({"options": options}).encode())
    assert status == 200 and json.loads(body)["plan"]["choice"]["seq_parallel_communication_data_type"] == "bf16"


def test_published_sources_whose_sp_runs_outside_the_engine_keep_the_training_dtype():
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    import published_runs as pr

    setup = {"gpu": "a100-80gb", "gpus_per_node": 8, "nodes": 1, "stage": 3, "offload_optimizer": "none",
             "offload_param": "none", "precision": "bf16", "micro_batch": 1, "grad_accum": 1, "seq_len": 131072,
             "activation_checkpointing": True, "sequence_parallel": 8, "params": 7e9, "hidden_size": 4096,
             "num_layers": 32, "vocab_size": 32000}
    xtuner = pr.plan_argv(setup, "https://github.com/InternLM/xtuner/blob/main/docs/en/acceleration/benchmark.rst")
    arctic = pr.plan_argv(setup, "https://github.com/snowflakedb/ArcticTraining/blob/main/projects/sequence-parallelism")
    assert xtuner[xtuner.index("--seq-parallel-comm-dtype") + 1] == "bf16"
    assert "--seq-parallel-comm-dtype" not in arctic
    assert "--seq-parallel-comm-dtype" not in pr.plan_argv({**setup, "sequence_parallel": 1}, "github.com/InternLM/xtuner")


def test_the_edge_grows_each_phase_from_its_own_terms():
    """What grows with the sequence is, in each phase, the terms whose bytes differ from the shortest sequence's: a copy
    held at one moment (the reduction's) does not offset another moment's growth (the recomputed layer's), nor does a
    constant alternative of a term (the recomputed layer's MLP moment at one token, its attention moment at length)."""
    fixed = {"backward_reduce": {"states": 8, "copy": 2}, "backward_recompute": {"states": 8, "layer": 3}}
    at = {"backward_reduce": {"states": 8, "copy": 2}, "backward_recompute": {"states": 8, "layer": 40}}
    assert edge_bytes(fixed, at, 1.2) == pytest.approx(8 + 1.2 * 40)
    assert edge_bytes(fixed, at, 1.0) == 48
    assert edge_bytes({"p": {"states": 8}}, {"p": {"states": 8, "acts": 10}}, 1.5) == pytest.approx(23)
