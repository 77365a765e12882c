"""Probe: a failure on one worker in the middle of a loop of runs, under torchrun.

    torchrun --nproc-per-node 4 tests/torchrun_probe.py MODE

``MODE``: ``fault`` (``MPIREDIST_FAULT`` set by the caller raises inside
mpiredist on one worker, in a Transfer's all-to-all over gloo), ``sigkill``
(worker 1 kills itself with SIGKILL in the sixth run, while the others are
inside the move).  Prints ``done`` on worker 0 if the loop ends normally.
"""

import os
import signal
import sys

import torch
import torch.distributed as dist

import mpiredist as mr


def main(mode):
    dist.init_process_group("gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    shape = (64 * size, 256)
    t = mr.Transfer(shape, "float32", mr.Mesh({"x": size}), "[{x}, {}]", "[{}, {x}]")
    block = torch.ones(t.source_shape)
    print(f"rank {rank} starts", flush=True)
    for i in range(20):
        if mode == "sigkill" and i == 5 and rank == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        t.run(block)
    if rank == 0:
        print("done", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
