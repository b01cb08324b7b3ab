"""permd.nccl from Python on a 2+ GPU machine: ids received into a torch CUDA tensor on GPU 1 equal the
offline Permutation's; run by tests/gpu/run.sh nccl (PYTHONPATH=python, PERMD_LIB, a running permd)."""
import sys

import torch

import permd
import permd.nccl

sock = sys.argv[1]
n = 1_000_003
with permd.Client(socket=sock) as c:
    c.put_dataset("py", n)
    with permd.nccl.Member(c, "pygroup", members=1, device=1, timeout=30) as m:
        assert (m.rank, m.nranks) == (1, 2), (m.rank, m.nranks)
        out = torch.empty(100_000, dtype=torch.int32, device="cuda:1")
        offset, seen = 0, []
        while True:
            got, offset = m.recv(out, "py", seed=4, epoch=2, world=1, rank=0, mode="exact", offset=offset)
            if got == 0:
                break
            seen.append(out[:got].cpu())
        ids = torch.cat(seen).tolist()
        assert ids == permd.Permutation(4, 2, n)[:].tolist(), "ids differ from the offline permutation"
print(f"python: {len(ids)} ids received into cuda:1, equal to permd.Permutation")
