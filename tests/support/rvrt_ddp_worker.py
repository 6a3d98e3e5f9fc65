"""Worker for tests/test_rvrt_ddp.py: a tiny RVRT trained a few Adam steps under DDP (gloo, CPU).

Launched with ``python -m torch.distributed.run --standalone --nproc_per_node=2 tests/support/rvrt_ddp_worker.py OUT``.
Each rank sees different random data; rank 0 writes ``OUT`` (JSON) with every rank's parameter checksum,
losses and how far the parameters moved.
"""

from __future__ import annotations

import json
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from models.network_rvrt import RVRT

TINY = dict(upscale=4, clip_size=2, window_size=(2, 4, 4), num_blocks=(1, 1, 1), depths=(2, 2, 2),
            embed_dims=(8, 8, 8), num_heads=(2, 2, 2), deformable_groups=4, attention_heads=4, spynet_path=None,
            use_checkpoint_ffn=True)


def main(out_path: str, steps: int = 3) -> None:
    dist.init_process_group('gloo')
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    torch.manual_seed(0)  # same initial weights on every rank (DDP also broadcasts rank 0's)
    net = RVRT(**TINY)
    start = torch.cat([p.detach().flatten() for p in net.parameters()]).clone()
    model = DistributedDataParallel(net)
    optim = torch.optim.Adam(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(1000 + rank)  # different data per rank
    losses = []
    for _ in range(steps):
        lq = torch.rand(1, 4, 3, 36, 36, generator=gen)
        gt = torch.rand(1, 4, 3, 144, 144, generator=gen)
        loss = (model(lq) - gt).abs().mean()
        optim.zero_grad(set_to_none=True)
        loss.backward()
        optim.step()
        losses.append(loss.item())
    flat = torch.cat([p.detach().flatten() for p in net.parameters()])
    stats = torch.tensor([flat.double().sum(), flat.double().square().sum(), (flat - start).abs().max().double()])
    gathered = [torch.zeros_like(stats) for _ in range(world)]
    dist.all_gather(gathered, stats)
    all_losses = [None] * world
    dist.all_gather_object(all_losses, losses)
    if rank == 0:
        with open(out_path, 'w') as fh:
            json.dump({'stats': [g.tolist() for g in gathered], 'losses': all_losses, 'world': world}, fh)
    dist.destroy_process_group()


if __name__ == '__main__':
    main(sys.argv[1])
