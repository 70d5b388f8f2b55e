"""A rank for the launch tests: print RANK/WORLD_SIZE/LOCAL_RANK, gloo all_reduce of rank+1, exit.

Run by `deepspeed ... --module tests.helpers.ranks_probe [--tag TAG]`. Prints one line per rank:
  PROBE tag=TAG rank=R world=W local_rank=L host=H sum=S
where S is the all_reduce sum of (rank + 1) over all ranks, i.e. W*(W+1)/2.
"""

import argparse
import os
import socket
import sys
import time

_T0 = time.time()


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tag", default="")
    parser.add_argument("--local_rank", type=int, default=None)  # DeepSpeed may pass it
    args, _unknown = parser.parse_known_args()

    import deepspeed
    import torch
    import torch.distributed as dist

    t_import = time.time() - _T0
    deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False, verbose=False)
    t_init = time.time() - _T0
    rank, world = dist.get_rank(), dist.get_world_size()
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    # one write per line: the ranks share the launcher's stdout
    _say(
        f"PROBE tag={args.tag} rank={os.environ.get('RANK')} world={os.environ.get('WORLD_SIZE')} "
        f"local_rank={os.environ.get('LOCAL_RANK')} dist_rank={rank} dist_world={world} "
        f"host={socket.gethostname()} sum={int(t.item())} t_import={t_import:.1f}s t_init={t_init:.1f}s"
    )
    dist.barrier()
    dist.destroy_process_group()
    _say(f"PROBE_DONE rank={rank} t={time.time() - _T0:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
