#!/usr/bin/env python3
"""torch.matmul timed as `ember bench gemm` times Ember's products: for each shape M×K×N, C = A B with A [M, K] and
B [K, N] in f32 (TF32 off: plain FP32 products), bf16 and f16 (tensor cores on NVIDIA GPUs). Per product: 2 untimed
products, then --iters repetitions of --calls back-to-back products closed by one synchronisation (CUDA events on a
GPU), median (minimum); GFLOP/s of the median count 2·M·N·K, with --peak-gflops their share of that peak. Prints the
rows of `ember bench gemm`'s table.

    python3 scripts/reference/matmul.py --device cuda --shapes 4096x4096x4096,8192x768x2304
"""
import argparse

import torch

from attention import timed  # scripts/reference/attention.py: the same timing as the attention rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--shapes", default="1024x1024x1024,4096x4096x4096,8192x768x2304,8192x768x3072,8192x3072x768")
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--calls", type=int, default=4)
    ap.add_argument("--peak-gflops", type=float, default=None)
    a = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    cuda = a.device.startswith("cuda")
    for shape in a.shapes.split(","):
        m, k, n = (int(x) for x in shape.split("x"))
        for name, dtype in [("torch f32", torch.float32), ("torch bf16", torch.bfloat16), ("torch f16", torch.float16)]:
            x = torch.randn(m, k, device=a.device, dtype=dtype)
            y = torch.randn(k, n, device=a.device, dtype=dtype)
            median, low = timed(lambda: x @ y, a, cuda)
            rate = 2.0 * m * n * k / median / 1e6
            share = f" {100.0 * rate / a.peak_gflops:.1f} |" if a.peak_gflops else ""
            print(f"| {m}×{k}×{n} | {name} | {median:.3f} ({low:.3f}) | {rate:.0f} |{share}")


if __name__ == "__main__":
    main()
