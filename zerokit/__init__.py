"""zerokit: will it fit, which ZeRO setup, how long, and run it.

    import zerokit
    plan = zerokit.plan("llama-3-8b", gpu="h100-80gb", gpus_per_node=8, seq_len=4096)
    plan.fits, plan.best.setup.label, plan.ds_config

The Python API (zerokit.api, docs/api.md): plan, compare_gpus, render, check and launch take the command line's
long options as keywords and give the answers `zerokit plan|render|check|launch` print. The core (model spec,
memory model, time model, planner) is pure Python; torch, deepspeed and transformers are imported only inside the
functions that need them.
"""

__version__ = "0.1.0"

from zerokit.api import Check, Comparison, Launch, Plan, check, compare_gpus, launch, plan, render
from zerokit.core.errors import ZerokitError

__all__ = ["Check", "Comparison", "Launch", "Plan", "ZerokitError", "check", "compare_gpus", "launch", "plan",
           "render"]
