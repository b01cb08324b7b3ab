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


if __name__ == "__main__":
    print(f"\n### torch.randperm(device='cuda', dtype=int32), torch {torch.__version__} (G indices/s)\n")
    print("| n | torch.randperm |")
    print("|---|---|")
    for n in [(1 << 29) + 1, 1 << 29]:
        print(f"| {n} | {bench(n):.2f} |")
    sys.stdout.flush()
