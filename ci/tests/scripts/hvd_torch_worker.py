"""Horovod + PyTorch worker, started by `horovodrun -np 2 -H localhost:2 --gloo`.

Checks collectives and that hvd.DistributedOptimizer keeps a model in sync across ranks.
Writes <out_dir>/rank<r>.json. Usage: hvd_torch_worker.py <out_dir>
"""
import json
import os
import sys

import torch
import horovod.torch as hvd

hvd.init()
rank, size = hvd.rank(), hvd.size()
result = {"rank": rank, "size": size}

x = torch.tensor([rank + 1.0, 10.0 * (rank + 1)])
result["allreduce_sum"] = hvd.allreduce(x, op=hvd.Sum).tolist()
result["allreduce_avg"] = hvd.allreduce(x, op=hvd.Average).tolist()
result["allgather"] = hvd.allgather(torch.tensor([[float(rank)]])).ravel().tolist()
result["broadcast"] = hvd.broadcast(torch.tensor([float(rank + 7)]), root_rank=1).tolist()

torch.manual_seed(100 + rank)  # different initial weights: broadcast_parameters must equalise them
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                               named_parameters=model.named_parameters())
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
gen = torch.Generator().manual_seed(rank)
for _ in range(3):
    features = torch.randn(16, 4, generator=gen)
    loss = ((model(features).squeeze(1) - features.sum(1) - rank) ** 2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
result["weights"] = torch.cat([p.detach().ravel() for p in model.parameters()]).tolist()

with open(os.path.join(sys.argv[1], f"rank{rank}.json"), "w") as f:
    json.dump(result, f)
