"""torch.distributed worker for torchrun and `python -m torch.distributed.launch`.

gloo all_reduce, then 2 DDP steps checked against the same 2 steps computed in one process
(DDP averages gradients: its update must equal plain SGD on the mean of the ranks' losses).
Writes <out_dir>/rank<r>.json.
Usage: ddp_worker.py [--local-rank N | --local_rank N] <out_dir>
"""
import argparse
import json
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from recsys_common.torch_distributed import live_gloo_threads, shutdown_process_group

parser = argparse.ArgumentParser()
# torch.distributed.launch (without --use_env) passes --local-rank; older launchers --local_rank.
parser.add_argument("--local-rank", "--local_rank", dest="local_rank", type=int, default=None)
parser.add_argument("out_dir")
args = parser.parse_args()

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
result = {"rank": rank, "world_size": world, "local_rank_arg": args.local_rank,
          "local_rank_env": os.environ.get("LOCAL_RANK")}

t = torch.tensor([rank + 1.0, 10.0 * (rank + 1)])
dist.all_reduce(t)  # SUM
result["all_reduce"] = t.tolist()


def make_model(seed):
    torch.manual_seed(seed)
    return torch.nn.Linear(4, 1)


def batch(r, step):
    gen = torch.Generator().manual_seed(1000 * step + r)
    features = torch.randn(8, 4, generator=gen)
    return features, features.sum(1, keepdim=True) + r


ddp = DistributedDataParallel(make_model(seed=rank))  # rank-dependent init: DDP broadcasts rank 0's
opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
for step in range(2):
    x, y = batch(rank, step)
    opt.zero_grad()
    torch.nn.functional.mse_loss(ddp(x), y).backward()
    opt.step()

reference = make_model(seed=0)
ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
for step in range(2):
    ref_opt.zero_grad()
    loss = sum(torch.nn.functional.mse_loss(reference(batch(r, step)[0]), batch(r, step)[1])
               for r in range(world)) / world
    loss.backward()
    ref_opt.step()

flat = lambda m: torch.cat([p.detach().ravel() for p in m.parameters()]).tolist()  # noqa: E731
result["ddp_weights"] = flat(ddp.module)
result["reference_weights"] = flat(reference)
result["initial_weights"] = flat(make_model(seed=0))
# The repository's one teardown (recsys_common.torch_distributed): drop the DDP model, meet, destroy the group and
# let its gloo threads go before the interpreter exits (a live one can abort the process at exit).
del ddp, opt
shutdown_process_group()
result["gloo_threads_after_teardown"] = live_gloo_threads()
with open(os.path.join(args.out_dir, f"rank{rank}.json"), "w") as f:
    json.dump(result, f)
