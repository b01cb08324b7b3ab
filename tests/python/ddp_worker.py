"""One rank of test_ddp.py: a real gloo process group (a FileStore, loopback) running permd.Sampler.

  padding  torch's test_DistributedSampler_padding (torch/testing/_internal/distributed/distributed_test.py),
           with permd.Sampler for DistributedSampler, then the same checks of exact mode
  train    DDP over exact mode, the docs/python.md recipe: ranks may read one sample more than others, so the
           loop runs inside model.join() (--no-join leaves it out: the negative control). Each step's ids go to
           OUT/ids-RANK.txt before its backward pass; with --ckpt, rank 0 saves the sampler's state every
           --every steps (--resume starts from it); --socket serves the ids from a permd daemon."""
import argparse
import contextlib
import datetime
import json
import math
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader

import permd


def padding():
    # torch's test, with permd.Sampler for DistributedSampler
    world_size = dist.get_world_size()
    dataset_size = 100 + world_size + 1
    dataset = [torch.ones(1) * i for i in range(dataset_size)]
    dataset_tiny_size = max(world_size // 2 - 1, 1)
    dataset_tiny = [torch.ones(1) * i for i in range(dataset_tiny_size)]

    dist_sampler = permd.Sampler(dataset=dataset, drop_last=True)
    local_num_samples, local_dataset_size = dist_sampler.num_samples, dist_sampler.total_size
    effective_dataset_size = (math.ceil((dataset_size - world_size) / world_size)
                              if dataset_size % world_size != 0 else dataset_size / world_size)
    assert local_num_samples == effective_dataset_size, (local_num_samples, effective_dataset_size)
    assert local_dataset_size == local_num_samples * world_size
    assert len(list(iter(dist_sampler))) == local_num_samples

    def validate_global_samples(local_num_samples):
        world_samples = [torch.LongTensor([0]) for _ in range(world_size)]
        dist.all_gather(world_samples, torch.tensor([local_num_samples]))
        world_samples = [sample.item() for sample in world_samples]
        assert len(set(world_samples)) == 1, world_samples

    validate_global_samples(local_num_samples)
    # then DistributedSampler(dataset=dataset) and DistributedSampler(dataset=dataset_tiny): padded
    for added, size in [(permd.Sampler(dataset=dataset), dataset_size),
                        (permd.Sampler(dataset=dataset_tiny), dataset_tiny_size)]:
        local_num_samples, local_dataset_size = added.num_samples, added.total_size
        assert local_num_samples == math.ceil(size / world_size)
        assert local_dataset_size == local_num_samples * world_size
        assert len(list(iter(added))) == local_num_samples
        validate_global_samples(local_num_samples)

    # exact mode: this rank's count and the dataset's size; every sample on exactly one rank
    exact = permd.Sampler(dataset=dataset, mode="exact")
    assert exact.total_size == dataset_size
    mine = list(exact)
    assert len(mine) == exact.num_samples
    everyone = [None] * world_size
    dist.all_gather_object(everyone, mine)
    assert sorted(i for ids in everyone for i in ids) == list(range(dataset_size)), everyone


def train(a):
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(1, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    client = permd.Client(socket=a.socket) if a.socket else None
    # num_replicas and rank come from the process group, as with DistributedSampler
    s = permd.Sampler(size=a.n, seed=7, mode="exact", client=client, name=a.dataset if client else None)
    state = None
    if a.resume:
        with open(a.ckpt) as f:
            state = json.load(f)
        s.load_state_dict(state["sampler"])
    s.set_epoch(a.epoch)
    loader = DataLoader(range(a.n), batch_size=a.bs, sampler=s)
    log = open(os.path.join(a.out, f"ids-{dist.get_rank()}.txt"), "w")
    with model.join() if a.join else contextlib.nullcontext():
        for step, batch in enumerate(loader, 1):
            log.write(f"{step} {' '.join(map(str, batch.tolist()))}\n")
            log.flush()  # in the kernel before this step's all-reduce: a SIGKILL cannot lose it
            loss = model(batch.float().unsqueeze(1) / a.n).square().sum()
            opt.zero_grad()
            loss.backward()
            opt.step()
            if a.ckpt and not a.resume and dist.get_rank() == 0 and step % a.every == 0:
                tmp = a.ckpt + ".tmp"
                with open(tmp, "w") as f:  # rank 0's state: in exact mode it is the one that is exact at the end
                    json.dump({"step": step, "sampler": s.state_dict(consumed=step * a.bs)}, f)
                os.replace(tmp, a.ckpt)
            time.sleep(a.delay)
    log.write("done\n")
    log.close()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("what", choices=["padding", "train"])
    p.add_argument("--store", required=True)
    p.add_argument("--world", type=int, required=True)
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--out", default=".")
    p.add_argument("--n", type=int, default=0)
    p.add_argument("--bs", type=int, default=4)
    p.add_argument("--epoch", type=int, default=0)
    p.add_argument("--no-join", dest="join", action="store_false")
    p.add_argument("--socket")
    p.add_argument("--dataset")
    p.add_argument("--ckpt")
    p.add_argument("--every", type=int, default=1)
    p.add_argument("--delay", type=float, default=0.0)
    p.add_argument("--resume", action="store_true")
    p.add_argument("--timeout", type=float, default=60)
    a = p.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{a.store}", world_size=a.world, rank=a.rank,
                            timeout=datetime.timedelta(seconds=a.timeout))
    padding() if a.what == "padding" else train(a)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
