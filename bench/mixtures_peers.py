"""Time to the first batch and memory of a mixture: permd.Mixture against what users build today, in one run.

Peers: a Megatron-style blended index built with numpy (BlendedDataset materializes, for every position, the
dataset and the sample to read: here the deterministic interleave by sorting each dataset's k-th sample at
(k + 1/2)/w_j, then each dataset's samples shuffled once), and torch's WeightedRandomSampler: over the
concatenated samples (per-sample weights w_j/n_j, with replacement; its __iter__ draws all L at once; torch
refuses more than 2^24 categories), and over the datasets followed by a uniform sample in the chosen one. Two
peers that do less work than a user's full build, to bound the comparison from below: the numpy index loaded
from the .npy files of an earlier build (Megatron caches its blended index so; memory-mapped, the page cache
warm, the build not timed), and torch.multinomial drawing only the first batch's datasets (no epoch order, no
resume: the least any sampler can do).
Each case runs in a fresh process under an address-space cap (PEER_MEM_GIB), its memory the growth of its peak
RSS over the interpreter with the libraries imported: bench/peerlib.py.
usage: python3 bench/mixtures_peers.py [L ...]  (default 10^7 10^8 10^9; PYTHONPATH=python)
"""
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

import peerlib

SIZES = [20_000_000, 17_000_000, 3_000_000, 10_000_000]
WEIGHTS = [4, 3, 2, 1]
BATCH, WORLD = 1024, 8


def case_permd(length):
    import permd
    t0 = time.perf_counter()
    m = permd.Mixture(1, 0, SIZES, WEIGHTS, length=length)
    m.rank(WORLD, 0, "exact", 0, BATCH)
    return {"first": time.perf_counter() - t0}


def case_permd_sampler(length):
    """What a trainer runs: a permd.Sampler over the mixture, the first batch from its iterator."""
    import permd
    t0 = time.perf_counter()
    m = permd.Mixture(1, 0, SIZES, WEIGHTS, length=length)
    it = iter(permd.Sampler(mixture=m, num_replicas=WORLD, rank=0, mode="exact"))
    [next(it) for _ in range(BATCH)]
    return {"first": time.perf_counter() - t0}


def case_permd_daemon(length):
    """The same through a permd daemon ($PERMD_SOCKET): the mixture registered beforehand (once, as a platform
    does), then a Sampler built on its name and the first batch fetched."""
    import permd
    client = permd.Client()
    names = [f"peers-{j}" for j in range(len(SIZES))]
    for name, n in zip(names, SIZES):
        client.put_dataset(name, n)
    client.put_mixture(f"peers-{length}", names, WEIGHTS, length=length)
    t0 = time.perf_counter()
    it = iter(permd.Sampler(num_replicas=WORLD, rank=0, seed=1, mode="exact", client=client, name=f"peers-{length}"))
    [next(it) for _ in range(BATCH)]
    return {"first": time.perf_counter() - t0}


def build_numpy_index(length):
    """The Megatron-style blended index: (dataset of each position, sample of each position)."""
    import numpy as np
    w = np.array(WEIGHTS, dtype=np.float64) / sum(WEIGHTS)
    counts = np.floor(w * length).astype(np.int64)
    counts[: length - counts.sum()] += 1
    keys = np.concatenate([(np.arange(c) + 0.5) / wj for c, wj in zip(counts, w)])
    order = np.argsort(keys, kind="stable")
    dataset_index = np.repeat(np.arange(len(SIZES), dtype=np.uint8), counts)[order]
    rng = np.random.default_rng(1)
    sample_index = np.empty(length, dtype=np.int64)
    for j, (c, n) in enumerate(zip(counts, SIZES)):  # each dataset's draws: a shuffled pass, repeated as needed
        reps = -(-c // n)
        draws = np.concatenate([rng.permutation(n) for _ in range(reps)])[:c] if c else np.empty(0, np.int64)
        sample_index[dataset_index == j] = draws
    return dataset_index, sample_index


def case_numpy_index(length):
    t0 = time.perf_counter()
    _, sample_index = build_numpy_index(length)
    sample_index[0:BATCH * WORLD:WORLD].copy()
    return {"first": time.perf_counter() - t0}


def cache_files(length):
    d = os.environ["PEERS_CACHE"]  # set by main() for the case below
    return os.path.join(d, f"dataset_index_{length}.npy"), os.path.join(d, f"sample_index_{length}.npy")


def build_cache(length):
    """Untimed: writes the index as Megatron's cache does (one .npy per array)."""
    import numpy as np
    dataset_index, sample_index = build_numpy_index(length)
    for path, a in zip(cache_files(length), (dataset_index, sample_index)):
        np.save(path, a)


def case_numpy_cached(length):
    """A later run of the Megatron-style loader: both arrays memory-mapped from the cache, the first batch read."""
    import numpy as np
    t0 = time.perf_counter()
    dataset_index, sample_index = (np.load(p, mmap_mode="r") for p in cache_files(length))
    np.array(sample_index[0:BATCH * WORLD:WORLD])
    np.array(dataset_index[0:BATCH * WORLD:WORLD])
    return {"first": time.perf_counter() - t0}


def case_torch_sampler(length):
    import torch
    from torch.utils.data import WeightedRandomSampler
    t0 = time.perf_counter()
    weights = torch.cat([torch.full((n,), w / n, dtype=torch.double) for n, w in zip(SIZES, WEIGHTS)])
    it = iter(WeightedRandomSampler(weights, length, replacement=True, generator=torch.Generator().manual_seed(1)))
    [next(it) for _ in range(BATCH)]
    return {"first": time.perf_counter() - t0}


def case_torch_two_level(length):
    """What users fall back to past 2^24 samples: WeightedRandomSampler picks the dataset, randint the sample."""
    import torch
    from torch.utils.data import WeightedRandomSampler
    t0 = time.perf_counter()
    g = torch.Generator().manual_seed(1)
    datasets = torch.tensor(list(WeightedRandomSampler(torch.tensor(WEIGHTS, dtype=torch.double), length,
                                                       replacement=True, generator=g)))
    offsets = torch.tensor([0] + SIZES[:-1]).cumsum(0)
    sizes = torch.tensor(SIZES)
    offsets[datasets[:BATCH]] + (torch.rand(BATCH, generator=g) * sizes[datasets[:BATCH]]).long()
    return {"first": time.perf_counter() - t0}


def case_torch_first_batch(length):
    """The least a sampler can do: the first batch's datasets by torch.multinomial, then randint (L unused)."""
    import torch
    t0 = time.perf_counter()
    g = torch.Generator().manual_seed(1)
    datasets = torch.multinomial(torch.tensor(WEIGHTS, dtype=torch.double), BATCH * WORLD, replacement=True,
                                 generator=g)[0::WORLD]
    offsets = torch.tensor([0] + SIZES[:-1]).cumsum(0)
    sizes = torch.tensor(SIZES)
    offsets[datasets] + (torch.rand(BATCH, generator=g) * sizes[datasets]).long()
    return {"first": time.perf_counter() - t0}


CASES = {"permd.Mixture": case_permd, "permd.Sampler(mixture=...)": case_permd_sampler,
         "permd.Sampler(client=, name=) on a permd daemon": case_permd_daemon,
         "numpy blended index (Megatron-style)": case_numpy_index,
         "numpy blended index, loaded from its cache (mmap; build not timed)": case_numpy_cached,
         "torch WeightedRandomSampler over the samples": case_torch_sampler,
         "torch WeightedRandomSampler over the datasets, then randint": case_torch_two_level,
         "torch.multinomial for the first batch only (no order, no resume)": case_torch_first_batch}


def main():
    if len(sys.argv) == 5 and sys.argv[1] == "--child":
        return peerlib.child(CASES, sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    if len(sys.argv) == 4 and sys.argv[1] == "--build-cache":
        resource.setrlimit(resource.RLIMIT_AS, (int(sys.argv[3]), int(sys.argv[3])))
        return build_cache(int(sys.argv[2]))
    lengths = [int(float(x)) for x in sys.argv[1:]] or [10 ** 7, 10 ** 8, 10 ** 9]
    cap = peerlib.memory_cap()
    print(f"Components {SIZES} (N = {sum(SIZES)}), weights {WEIGHTS}; the first batch: rank 0 of {WORLD}, "
          f"{BATCH} ids; each case in a fresh process, its address space capped at {cap / 2 ** 30:.1f} GiB\n")
    print("| L | method | first batch (ms) | memory (MiB) | vs permd.Mixture (time) | vs permd.Mixture (memory) |\n"
          "|---:|---|---:|---:|---:|---:|")
    cases = [c for c in CASES if os.environ.get("PERMD_SOCKET") or CASES[c] is not case_permd_daemon]
    os.environ["PEERS_CACHE"] = tempfile.mkdtemp(prefix="permd-peers-")
    try:
        for length in lengths:
            run_length(length, cases, cap)
    finally:
        shutil.rmtree(os.environ["PEERS_CACHE"], ignore_errors=True)


def run_case(name, length, cap):
    """peerlib.run_case, the numpy cache built first (untimed) for the case that loads it, and removed after."""
    if CASES[name] is case_numpy_cached:
        out = subprocess.run([sys.executable, __file__, "--build-cache", str(length), str(cap)],
                             capture_output=True, text=True, env=os.environ)
        if out.returncode:
            why = (out.stderr.strip().splitlines() or [f"exit status {out.returncode}"])[-1]
            return {"error": f"building the cache: {why}"}
    r = peerlib.run_case(__file__, name, length, cap)
    if CASES[name] is case_numpy_cached:  # this length's cache is done with (10^9 would hold 9 GB)
        for path in cache_files(length):
            os.remove(path)
    return r


def run_length(length, cases, cap):
    base = None
    for name in cases:
        r = run_case(name, length, cap)
        if r["error"]:
            print(f"| {length:.0e} | {name} | {peerlib.failed(r)} | | | |", flush=True)
            continue
        mib, seconds = r["kib"] / 1024, r["times"]["first"]
        if base is None:  # permd.Mixture: the ratios' baseline (its RSS growth is at the noise floor)
            base = (seconds, max(mib, 0.1))
            ratios = "| 1x | 1x |"
        elif name.startswith("permd"):
            ratios = f"| {peerlib.times(seconds / base[0])} | |"
        else:
            ratios = f"| {peerlib.times(seconds / base[0])} | {peerlib.times(max(mib, 0.1) / base[1])} |"
        print(f"| {length:.0e} | {name} | {seconds * 1e3:.2f} | {mib:.1f} {ratios}", flush=True)


if __name__ == "__main__":
    main()
