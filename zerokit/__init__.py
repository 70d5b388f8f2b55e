"""zerokit: will it fit, which ZeRO setup, how long, and run it.

The core (model spec, memory model, time model, planner) is pure Python; torch, deepspeed and
transformers are imported only inside the functions that need them.
"""

__version__ = "0.1.0"
