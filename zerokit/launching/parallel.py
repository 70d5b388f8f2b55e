"""What zerokit's rank entrypoint (launching/train.py) does for parallelism beyond data parallelism and for ALST's tiled
compute, each piece as DeepSpeed 0.19.8 ships it (deepspeed/runtime/sequence_parallel/ulysses_sp.py,
module_inject/auto_tp.py):

- Ulysses sequence parallelism: UlyssesSPAttentionHF.register_with_transformers swaps the model's sdpa attention for
  its all-to-all wrapper and returns the mpu deepspeed.initialize takes; every rank of an SP group reads the same
  sample and keeps its slice of the sequence (sp_shard); the loss is the token-weighted mean over the group
  (sp_group_loss), as transformers' deepspeed_sp_compute_loss computes it.
- AutoTP: the config's tensor_parallel.autotp_size is all DeepSpeed needs; every rank of a TP group reads the same
  sample (DeepSpeed checks it on the first batch: engine._configure_tensor_parallel_states).
- TiledFusedLogitsLoss: the LM head and the loss run one slice of tokens at a time (tiled_causal_lm_loss).
- TiledMLP: every decoder MLP runs one slice of tokens at a time and is recomputed in backward (tile_mlps).

Data layout: DeepSpeed builds TP groups (utils/groups.py _init_tp_mesh_device: a (data, tensor) mesh) and SP groups
(sequence_parallel/parallel_state_sp.py initialize_sequence_parallel: range(i * sp, (i + 1) * sp)) from consecutive
ranks, so rank r belongs to data-parallel replica r // (tp x sp). DeepSpeed's own UlyssesSPDataLoaderAdapter gathers
one sample from each rank of the group instead; zerokit's loop keeps its resumable sampler over data-parallel
replicas (the position in an epoch is samples consumed, launching/train.py) and slices the sequence the way the adapter
does (labels shifted and padded with -100 first, position_ids the global positions).
"""

from __future__ import annotations

from dataclasses import dataclass

from zerokit.config.read import parallelism_from_config
from zerokit.estimate.memory import tiled_loss_shards, tiled_mlp_shards


@dataclass(frozen=True)
class RankLayout:
    """Where one rank sits: its data-parallel replica and its place in its TP or SP group."""

    tensor_parallel: int
    sequence_parallel: int
    rank: int
    world_size: int
    pipeline_parallel: int = 1  # the config's pipeline.stages: the model runs as a PipelineModule (launching/pipeline.py)

    @classmethod
    def from_config(cls, ds_config: dict, rank: int, world_size: int) -> "RankLayout":
        par = parallelism_from_config(ds_config)  # the one reader of the degrees a config asks for
        return cls(par.tensor_parallel, par.sequence_parallel, rank, world_size, par.pipeline_parallel)

    @property
    def model_parallel(self) -> int:
        return self.tensor_parallel * self.sequence_parallel * self.pipeline_parallel

    @property
    def data_parallel(self) -> int:
        return self.world_size // self.model_parallel

    @property
    def data_rank(self) -> int:
        if self.pipeline_parallel > 1:
            # PipeDataParallelTopology (pipe/topology.py): axes (pipe, data), rank = stage x data-parallel + replica
            return self.rank % self.data_parallel
        return self.rank // self.model_parallel

    @property
    def sp_rank(self) -> int:
        return self.rank % self.sequence_parallel


def register_ulysses(model, sequence_parallel: int, micro_batch: int):
    """The SP mpu for deepspeed.initialize (None when sp is 1). The model must run sdpa: Ulysses wraps the core
    attention function the model calls (register_with_transformers replaces ALL_ATTENTION_FUNCTIONS["sdpa"])."""
    if sequence_parallel <= 1:
        return None
    from deepspeed.runtime.sequence_parallel.ulysses_sp import UlyssesSPAttentionHF

    impl = getattr(model.config, "_attn_implementation", None) or "sdpa"
    return UlyssesSPAttentionHF.register_with_transformers(
        model_name_or_path=model, core_attn_implementation=impl, sequence_parallel_size=sequence_parallel,
        micro_batch_size=micro_batch, seq_length_is_variable=True)


def sp_shard(batch: dict, layout: RankLayout) -> dict:
    """This rank's slice of a batch every rank of its SP group read whole: input_ids, position_ids and shift_labels
    (labels shifted left, -100 at the end: UlyssesSPDataLoaderAdapter.refill), each seq / sp tokens. The attention
    mask is dropped: Ulysses discards 4D masks and masks causally by position_ids (uattn_wrapper)."""
    import torch

    sp = layout.sequence_parallel
    ids = batch["input_ids"]
    seq = ids.shape[1]
    if seq % sp:
        raise ValueError(f"sequence length {seq} is not divisible by sequence_parallel_size {sp}")
    chunk = seq // sp
    shift = shift_labels_of(batch)
    positions = torch.arange(seq, dtype=torch.long).unsqueeze(0).expand_as(ids)
    lo, hi = chunk * layout.sp_rank, chunk * (layout.sp_rank + 1)
    return {"input_ids": ids[:, lo:hi].contiguous(), "position_ids": positions[:, lo:hi].contiguous(),
            "shift_labels": shift[:, lo:hi].contiguous()}


def shift_labels_of(batch: dict):
    """shift_labels for an unsplit batch (the tiled loss takes them so it needs no logits shift)."""
    import torch

    labels = batch.get("labels", batch["input_ids"])
    return torch.nn.functional.pad(labels, (0, 1), value=-100)[..., 1:].contiguous()


def sp_group_loss(loss_sum, good_tokens, sp_group):
    """The SP group's mean loss over its real tokens, differentiable on every rank (transformers'
    integrations/deepspeed.py deepspeed_sp_compute_loss: all_gather the per-rank losses and token counts, weight,
    divide). ZeRO then averages the gradients over data x sequence ranks (utils/groups.py
    _get_sequence_data_parallel_group), which makes each replica's gradient its group's mean."""
    import warnings

    import torch
    import torch.distributed.nn.functional as dnn

    with warnings.catch_warnings():  # torch 2.13 calls it deprecated; the replacement is not differentiable
        warnings.simplefilter("ignore", FutureWarning)
        sums = dnn.all_gather(loss_sum, group=sp_group)
        counts = [t.detach() for t in dnn.all_gather(good_tokens, group=sp_group)]
    total = torch.stack(sums).sum()
    return total / max(int(sum(int(c) for c in counts)), 1)


class HeadSwitch:
    """The LM head made to return its input inside the model's forward, so the model never materialises the logits;
    tiled_causal_lm_loss switches it back on for each slice. Calling the module itself keeps ZeRO-3's gather and
    release hooks (and AutoTP's gathering LinearLayer) around every use."""

    def __init__(self, head):
        self.head = head
        self.real = head.forward
        self.on = False
        head.forward = self._forward

    def _forward(self, x, *args, **kwargs):
        return self.real(x, *args, **kwargs) if self.on else x

    def logits(self, x):
        self.on = True
        try:
            return self.head(x)
        finally:
            self.on = False


def tiled_causal_lm_loss(switch: HeadSwitch, hidden, shift_labels, vocab_size: int):
    """(sum of the token losses, real tokens) through TiledFusedLogitsLoss in memory.tiled_loss_shards slices: the
    logits, their fp32 upcast and gradient exist for one slice at a time."""
    import torch
    from deepspeed.runtime.sequence_parallel.ulysses_sp import TiledFusedLogitsLoss

    tokens = hidden.shape[0] * hidden.shape[1]
    shards = min(tiled_loss_shards(tokens, vocab_size), tokens)

    def loss_fn(_self, x, y):
        logits = switch.logits(x)
        return torch.nn.functional.cross_entropy(logits.float().view(-1, logits.shape[-1]), y.view(-1),
                                                 ignore_index=-100, reduction="sum")

    loss_sum = TiledFusedLogitsLoss.apply(loss_fn, None, hidden, shift_labels, None, shards,
                                          [switch.head.weight], "sum")
    return loss_sum, (shift_labels != -100).sum()


def tile_mlps(model) -> int:
    """Run every decoder layer's MLP through TiledMLP (ulysses_sp.py), ceil(local seq / hidden) slices as DeepSpeed's
    own example picks (memory.tiled_mlp_shards); returns how many MLPs were wrapped."""
    from deepspeed.runtime.sequence_parallel.ulysses_sp import TiledMLP

    wrapped = 0
    for module in model.modules():
        # a gated MLP (Llama: gate/up/down_proj) or GPT-2's (c_fc, c_proj); an MLP's parameters are its Linears'
        if not ((hasattr(module, "up_proj") and hasattr(module, "down_proj"))
                or (hasattr(module, "c_fc") and hasattr(module, "c_proj"))):
            continue
        real = module.forward
        params = [p for p in module.parameters()]

        def forward(x, _real=real, _module=module, _params=params):
            shards = tiled_mlp_shards(x.shape[-2], x.shape[-1])
            if shards <= 1:
                return _real(x)
            return TiledMLP.apply(lambda _self, xs: _real(xs), _module, x, shards, _params)

        module.forward = forward
        wrapped += 1
    return wrapped
