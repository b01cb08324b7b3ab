"""torch.randperm on the GPU, the Python peer of bench/gpu_gen (prints a markdown table)."""
import sys
import time

import torch


def bench(n, reps=5):
    torch.randperm(n, device="cuda", dtype=torch.int32)
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        torch.randperm(n, device="cuda", dtype=torch.int32)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    return n / sorted(times)[len(times) // 2] / 1e9


def permd_rates(path):
    """{n: G indices/s} of permd's default generator, from gpu_gen's index table (its first) in this run's output."""
    rates = {}
    with open(path) as f:
        for line in f:
            if line.startswith("### ") and rates:
                break  # past the index table
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if len(cells) > 1 and cells[0].isdigit():
                rates[int(cells[0])] = float(cells[1])
    return rates


if __name__ == "__main__":
    permd = permd_rates(sys.argv[1]) if len(sys.argv) > 1 else {}
    print(f"\n### torch.randperm(device='cuda', dtype=int32), torch {torch.__version__} (G indices/s)\n")
    print("| n | torch.randperm | permd (default) / torch.randperm, this run |")
    print("|---|---|---|")
    for n in [(1 << 29) + 1, 1 << 29]:
        rate = bench(n)
        ratio = f"{permd[n] / rate:.2f}×" if n in permd else "(no permd row)"
        print(f"| {n} | {rate:.2f} | {ratio} |")
    sys.stdout.flush()
