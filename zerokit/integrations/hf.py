"""ZerokitCallback: the HF Trainer (and TRL's trainers, which are Trainers) writing the metrics zerokit's own loop
writes, so `zerokit launch ... -- python train.py ARGS` can put its prediction beside what the script measured.

    from zerokit.integrations.hf import ZerokitCallback
    trainer = Trainer(model=model, args=args, train_dataset=ds, callbacks=[ZerokitCallback()])

Every rank appends to OUT/metrics/rank{R}.jsonl (OUT: $ZEROKIT_OUTPUT_DIR, which `zerokit launch` sets, else the
Trainer's output_dir) the records zerokit.report.run_report reads: "start", one "step" per optimizer step (step
time, tokens, tokens/s, the loss when the Trainer logs it, peak memory) and "end".

Measured as zerokit's own loop measures (zerokit/measure/step_phases.py): on CUDA the allocator's peak, reset at
each step; on CPU the exact live-tensor-byte meter that zerokit.launching.user_script started before the script
built its model (started here, at the Trainer's init, when the script was not run through zerokit: the model's
parameters are then registered, its earlier temporaries missed). One phase, "step", from on_step_begin to
on_step_end: the Trainer runs forward and backward inside one call.

Tokens: the Trainer's own count (state.num_input_tokens_seen, summed over ranks); the callback turns it on
("all") when the script left it off. Step time: on_step_begin to on_step_end, as zerokit's loop times
forward + backward + optimizer step, without the checkpoint saves and logging that follow.
"""

from __future__ import annotations

import os
import time

from transformers import TrainerCallback  # this module runs inside a training script: transformers is loaded

from zerokit.launching.checkpoints import MetricsLog
from zerokit.measure.step_phases import memory_steps_from_env


def _env_int(name: str) -> int | None:
    v = os.environ.get(name, "")
    return int(v) if v.isdigit() else None


class ZerokitCallback(TrainerCallback):
    def __init__(self, output_dir: str | os.PathLike | None = None):
        self.output_dir = output_dir
        self.log = None  # MetricsLog, from on_train_begin
        self.phases = None
        self.meter_method = "none"
        self.attempt = _env_int("ZEROKIT_ATTEMPT") or 0
        self.run_id = os.environ.get("ZEROKIT_RUN_ID")
        self.memory_steps = memory_steps_from_env()  # as zerokit's loop: stop the CPU meter after
        self._own_meter = None
        self._steps_run = 0  # steps of this run (a resumed Trainer starts at its checkpoint's global_step)
        self._step_cm = None
        self._t0 = 0.0
        self._tokens0 = 0
        self._pending: dict | None = None
        self._train_t0 = 0.0
        self._world = 1
        self._rank = 0

    # -- set-up --------------------------------------------------------------------------------------
    def on_init_end(self, args, state, control, model=None, **kwargs):
        if getattr(args, "include_num_input_tokens_seen", "no") in ("no", False):
            args.include_num_input_tokens_seen = "all"  # tokens/s needs the Trainer's count
        from zerokit.launching.user_script import active_meter

        import torch

        if active_meter() is None and not torch.cuda.is_available() and os.environ.get("ZEROKIT_NO_MEMORY_METER") != "1":
            from zerokit.measure.meter import MemoryMeter

            self._own_meter = MemoryMeter("cpu").start()
            if model is not None:
                self._own_meter.register_module(model)

    def on_train_begin(self, args, state, control, model=None, optimizer=None, **kwargs):
        import torch

        from zerokit.launching.user_script import active_meter
        from zerokit.measure.step_phases import StepPhaseMeter

        self._rank, self._world = int(args.process_index), int(args.world_size)
        on_cuda = torch.cuda.is_available() and args.device.type == "cuda"
        meter = None if on_cuda else (active_meter() or self._own_meter)
        if meter is not None and model is not None:
            # labels for the category mix: parameters, gradients, optimizer states (DeepSpeed's wrapped optimizer)
            inner = getattr(optimizer, "optimizer", optimizer)
            try:
                from types import SimpleNamespace

                meter.register_deepspeed_engine(SimpleNamespace(module=model, optimizer=inner))
            except Exception:  # attribution is optional
                pass
        self.meter_method = "cuda_max_allocated" if on_cuda else (
            "none" if meter is None else "live_tensor_bytes" if meter is not self._own_meter
            else "live_tensor_bytes_from_trainer_init")
        self.phases = StepPhaseMeter(meter, on_cuda)
        self.log = MetricsLog(self.output_dir or os.environ.get("ZEROKIT_OUTPUT_DIR") or args.output_dir, self._rank)
        ds = getattr(args, "hf_deepspeed_config", None)
        zero = (ds.config.get("zero_optimization") or {}) if ds is not None else {}
        self._write({
            "event": "start", "rank": self._rank, "world_size": self._world, "attempt": self.attempt,
            "run_id": self.run_id, "resumed_from": int(state.global_step), "total_steps": int(state.max_steps),
            "zero_stage": int(zero.get("stage", 0) or 0) if ds is not None else None,
            "precision": "bf16" if args.bf16 else "fp16" if args.fp16 else "fp32",
            "micro_batch": int(args.per_device_train_batch_size), "grad_accum": int(args.gradient_accumulation_steps),
            "memory_method": self.meter_method, "time": time.time(), "init_peak_bytes": self.phases.init_peak(),
            "torch_threads": torch.get_num_threads(), "source": "ZerokitCallback",
        })
        self._train_t0 = time.time()

    # -- steps ---------------------------------------------------------------------------------------
    def on_step_begin(self, args, state, control, **kwargs):
        self._flush()
        self.phases.new_step()
        self._tokens0 = int(state.num_input_tokens_seen or 0)
        self._step_cm = self.phases.phase("step")
        self._step_cm.__enter__()
        self._t0 = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        step_time = time.perf_counter() - self._t0
        metered = self.phases.active and not self.phases.on_cuda
        if self._step_cm is not None:
            self._step_cm.__exit__(None, None, None)
            self._step_cm = None
        global_tokens = int(state.num_input_tokens_seen or 0) - self._tokens0
        tokens = global_tokens // max(1, self._world)  # the Trainer counts all ranks; batches are equal per rank
        rec = {"event": "step", "step": int(state.global_step), "step_time": step_time, "tokens": tokens,
               "tokens_per_s": tokens / step_time, "global_tokens_per_s": global_tokens / step_time,
               "epoch": state.epoch, "attempt": self.attempt, "run_id": self.run_id,
               "memory_method": self.meter_method, "time": time.time(), "metered": metered}
        rec.update(self.phases.step_fields())
        self._pending = rec  # the Trainer logs this step's loss right after on_step_end (on_log)
        self._steps_run += 1
        if self.memory_steps and metered and self._steps_run >= self.memory_steps:
            self.phases.stop()

    def on_log(self, args, state, control, logs=None, **kwargs):
        if self._pending is not None and logs and "loss" in logs:
            self._pending["loss"] = float(logs["loss"])
            if "learning_rate" in logs:
                self._pending["lr"] = float(logs["learning_rate"])
        self._flush()

    def on_train_end(self, args, state, control, **kwargs):
        self._flush()
        if self.log is None:
            return
        self._write({"event": "end", "rank": self._rank, "step": int(state.global_step), "attempt": self.attempt,
                     "run_id": self.run_id, "train_s": time.time() - self._train_t0,
                     "peak_allocated_bytes": int(self.phases.overall), "memory_method": self.meter_method,
                     "time": time.time()})
        self.log.close()
        self.log = None
        if self._own_meter is not None:
            self._own_meter.stop()

    # -- helpers -------------------------------------------------------------------------------------
    def _flush(self) -> None:
        if self._pending is not None:
            self._write(self._pending)
            self._pending = None

    def _write(self, rec: dict) -> None:
        if self.log is not None:
            self.log.write(rec)
