"""A user's own HF Trainer script, as `zerokit launch` runs it (and as the tests run it, on 2 CPU ranks):

    zerokit launch --model tiny-llama --gpu cpu --gpus-per-node 2 --seq-len 64 --global-batch 8 --steps 6 -- \
        python examples/train_hf_trainer.py --model tiny-llama --seq_len {seq_len} \
        --per_device_train_batch_size {micro_batch} --gradient_accumulation_steps {grad_accum} --max_steps {steps} \
        --output_dir {output_dir}/trainer --deepspeed {ds_config}

zerokit plans (or checks) the setup, renders the HF-style ds_config ("auto" values the Trainer fills from these
arguments), starts this script on every rank under the deepspeed launcher and writes the predicted-vs-measured
report from what ZerokitCallback records. The model is built from a config with random weights (a bundled name,
a local directory or a hub id); the data is zerokit's bundled tiny corpus, packed to --seq_len tokens.

With --sft the same data goes through TRL's SFTTrainer instead (if trl is installed).

On CPU the Trainer needs use_cpu=True and the gloo backend to see the ranks (accelerate otherwise sees one
process): this script sets both when no GPU is present.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

import torch
from transformers import (AutoConfig, AutoModelForCausalLM, AutoTokenizer, HfArgumentParser, Trainer,
                          TrainingArguments)

from zerokit.integrations.hf import ZerokitCallback


@dataclass
class ScriptArguments:
    model: str = field(default="tiny-llama", metadata={"help": "bundled config name, local directory or hub id"})
    seq_len: int = field(default=64, metadata={"help": "tokens per training sample"})
    sft: bool = field(default=False, metadata={"help": "train with TRL's SFTTrainer"})
    tokens: str = field(default="", metadata={"help": "train on this zerokit tokens.npy (the rows zerokit's own loop "
                                                      "reads) instead of packing the corpus here"})


def packed_corpus(tok, seq_len: int) -> list[dict]:
    """The bundled corpus, tokenized and cut into blocks of seq_len tokens (labels = inputs: causal LM)."""
    from zerokit.core.resources import bundled_corpus

    lines = bundled_corpus().read_text(encoding="utf-8").splitlines(keepends=True)
    ids = [i for piece in tok(lines, add_special_tokens=False)["input_ids"] for i in piece]
    return [{"input_ids": ids[i:i + seq_len], "labels": ids[i:i + seq_len]}
            for i in range(0, len(ids) - seq_len + 1, seq_len)]


def zerokit_rows(tokens: str) -> list[dict]:
    """The rows zerokit's loop feeds its model (zerokit.launching.train.make_dataset): tokens.npy and, where written
    beside it, labels.npy and attention_mask.npy (launch.data.load_arrays); labels = inputs where none were written."""
    from zerokit.launching.data import load_arrays

    arrays = load_arrays(tokens)
    rows = [{k: a[i].tolist() for k, a in arrays.items()} for i in range(arrays["input_ids"].shape[0])]
    for row in rows:
        row.setdefault("labels", row["input_ids"])
    return rows


def main() -> None:
    argv = sys.argv[1:]
    if not torch.cuda.is_available():  # see the module docstring; before parsing: TrainingArguments sets up devices
        argv += [a for a in ("--use_cpu", "true") if "--use_cpu" not in argv]
        argv += [a for a in ("--ddp_backend", "gloo") if "--ddp_backend" not in argv]
    script_args, args = HfArgumentParser((ScriptArguments, TrainingArguments)).parse_args_into_dataclasses(argv)
    from zerokit.spec.resolve import resolve_model

    resolved = resolve_model(script_args.model)
    config = AutoConfig.from_pretrained(resolved.source)
    torch.manual_seed(args.seed)
    if args.deepspeed:
        # Built after TrainingArguments and with DeepSpeed's process group up: with ZeRO-3 in args.deepspeed,
        # transformers builds the model under zero.Init, which reads the world size from deepspeed.comm
        import deepspeed

        deepspeed.init_distributed(dist_backend=args.ddp_backend)
    model = AutoModelForCausalLM.from_config(config)
    tok = AutoTokenizer.from_pretrained(resolved.tokenizer)
    data = zerokit_rows(script_args.tokens) if script_args.tokens else packed_corpus(tok, script_args.seq_len)
    if script_args.sft:
        from datasets import Dataset
        from trl import SFTConfig, SFTTrainer

        sft_args = SFTConfig(**{k: v for k, v in args.to_dict().items() if k in SFTConfig.__dataclass_fields__
                                and not k.startswith("_") and k != "push_to_hub_token"},
                             max_length=script_args.seq_len, packing=False, dataset_kwargs={"skip_prepare_dataset": True})
        trainer = SFTTrainer(model=model, args=sft_args, train_dataset=Dataset.from_list(data), processing_class=tok,
                             callbacks=[ZerokitCallback()])
    else:
        trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[ZerokitCallback()])
    trainer.train()


if __name__ == "__main__":
    main()
