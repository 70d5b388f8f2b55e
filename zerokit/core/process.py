"""How a rank that finished its work ends: every torch.distributed process group destroyed while the interpreter
is whole, then (zerokit's own ranks) out without the interpreter's teardown.

Why: a ProcessGroupGloo still alive at interpreter exit is destroyed during finalization, its worker threads still
joinable, and C++ calls std::terminate ("terminate called without an active exception", SIGABRT, the launcher's
exit 250 or torchrun's exitcode -6) after the job's work is done and written. It struck one or two real 2-rank jobs in 4 of
5 clean CI runs here (ZeRO-2 and ZeRO-3; zerokit's rank entrypoint, a plain torchrun script, a TRL script), never
on demand. PyTorch's own account and remedy: pytorch/pytorch#65513 (a gloo test aborted this way; fixed by an
explicit destroy_process_group()), #190489 (the same message from a gloo job that skips it), and the shutdown
section of torch.distributed's documentation (call destroy_process_group() near the end of main(), on every rank).
torch only leaves it to the script: an atexit hook that would do it (pytorch/pytorch#179291) was abandoned.

Only on success: a rank that raised may have peers still inside a collective, and a destroy there can hang
(pytorch/torchtitan#1342); the launcher's own teardown ends those.

torch is imported inside the functions (the core layer stays free of heavy imports)."""

from __future__ import annotations

import os
import sys


def close_process_groups() -> bool:
    """torch.distributed.destroy_process_group() for the default group and every group made from it (DeepSpeed's
    data-parallel, ZeRO and sequence-parallel groups included), if one is initialized. True if it destroyed any.

    Not collective for gloo (ProcessGroupGloo::shutdown is local); by the end of a script every collective it
    started has been waited on."""
    if "torch" not in sys.modules:  # nothing distributed can exist in a process that never imported torch
        return False
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return False
    dist.destroy_process_group()
    return True


def finish_script_rank() -> None:
    """The end of a user's script that returned or called sys.exit(0) (launching/user_script.py): groups closed, then
    what the interpreter's own exit would still do that the script can rely on (its atexit hooks, e.g. a tracker's
    final upload or logging's flush; every open file's buffer flushed), then os._exit(0) without the teardown in
    which a native thread pool left joinable (DeepSpeed's CPU communication op, torch's) calls std::terminate. With
    the groups closed and the interpreter's teardown kept, an HF Trainer script on 2 CPU ranks still ended with
    "terminate called without an active exception" (exit 250) in 1 of 4 runs here."""
    import atexit
    import gc
    import io

    close_process_groups()
    atexit._run_exitfuncs()
    for obj in gc.get_objects():
        if isinstance(obj, io.IOBase):
            try:
                if not obj.closed and obj.writable():
                    obj.flush()
            except (OSError, ValueError):
                pass  # a pipe whose reader left, a file closed under it: nothing of the script's left to save
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def finish_rank(exit_code: int) -> None:
    """The last call of zerokit's rank programs, after their last barrier: process groups closed, stdout and stderr
    flushed, then os._exit(exit_code), which also skips the destructors of any other native thread pool the
    libraries started (DeepSpeed's, torch's intra-op pool); everything the rank writes is closed before this."""
    close_process_groups()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(exit_code)
