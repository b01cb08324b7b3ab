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
        # int32 and int64 tensors in turn: the ids arrive in the tensor's width (Deliver.id_width)
        outs = [torch.empty(100_000, dtype=dtype, device="cuda:1") for dtype in (torch.int32, torch.int64)]
        offset, seen = 0, []
        while True:
            out = outs[len(seen) % 2]
            got, offset = m.recv(out, "py", seed=4, epoch=2, world=1, rank=0, mode="exact", offset=offset)
            if got == 0:
                break
            seen.append(out[:got].cpu().to(torch.int64))
        try:  # host memory is refused before permd is asked
            m.recv(torch.empty(8, dtype=torch.int64), "py", seed=4, epoch=2, world=1, rank=0)
            raise AssertionError("a host tensor was taken")
        except ValueError:
            pass
        ids = torch.cat(seen).tolist()
        assert ids == permd.Permutation(4, 2, n)[:].tolist(), "ids differ from the offline permutation"
print(f"python: {len(ids)} ids received into cuda:1, equal to permd.Permutation")
