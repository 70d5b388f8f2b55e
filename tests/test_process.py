"""zerokit.core.process: how a finished rank ends (process groups destroyed before the interpreter's teardown)."""

import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

SCRIPT = textwrap.dedent('''
    import sys
    import torch
    import torch.distributed as dist
    from zerokit.core.process import close_process_groups, finish_rank

    assert close_process_groups() is False  # nothing initialized yet
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%s", rank=0, world_size=1)
    side = dist.new_group([0])  # a group made from the default one, as DeepSpeed makes its DP/ZeRO groups
    t = torch.ones(3)
    dist.all_reduce(t, group=side)
    assert close_process_groups() is True
    assert not dist.is_initialized()
    assert close_process_groups() is False  # a second call (the user script closed it already) is harmless
    print("closed", flush=True)
    print("unflushed", end="")  # finish_rank flushes before os._exit
    finish_rank(int(sys.argv[1]))
    print("never")
''')


def test_close_process_groups_destroys_every_group_and_finish_rank_exits_with_the_code():
    """A real gloo process group and a subgroup: after close_process_groups the package is deinitialized (no group
    left for the interpreter's teardown to destroy), and finish_rank exits with the rank program's code without
    running anything after it, its output flushed."""
    from zerokit.measure.ranks import free_port

    for code in (0, 3):
        r = subprocess.run([sys.executable, "-c", SCRIPT % free_port(), str(code)], capture_output=True, text=True,
                           cwd=REPO, timeout=120)
        assert r.returncode == code, r.stderr[-2000:]
        assert r.stdout == "closed\nunflushed", r.stdout
