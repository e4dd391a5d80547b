#!/usr/bin/env python3
"""PyTorch's causal attention, timed as `ember bench attention` times Ember's: for each batch B, heads h, length T
and head dimension d, the forward and forward+backward (gradients of sum(o) for q, k and v) of

  sdpa-f32   torch.nn.functional.scaled_dot_product_attention(is_causal=True) in f32 (PyTorch picks the kernel)
  sdpa-bf16  the same in bf16 (FlashAttention on recent NVIDIA GPUs)
  naive-f32  softmax(q kᵀ / √d + mask) v with plain tensor ops in f32, TF32 off (plain FP32 matrix products)

Per call: 2 untimed calls, then --iters repetitions of --calls back-to-back calls closed by one synchronisation
(CUDA events on a GPU), median (minimum). GFLOP/s count 4·B·h·T²·d / 2 for the forward and 3.5× that for
forward+backward, as Ember's bench. Memory is torch.cuda.max_memory_allocated over the calls, inputs included.
Out of memory gives an "oom" cell. Prints a markdown table, then one `attention ...` line per measurement.

    python3 scripts/reference/attention.py --device cuda --batch 1,4 --heads 8,32 --lengths 512,1024 --head-dims 64,128
"""
import argparse
import math
import statistics
import time

import torch
import torch.nn.functional as F


def naive(q, k, v, mask):
    return torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.size(-1)) + mask, dim=-1) @ v


def sdpa(q, k, v, mask):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


IMPLS = {"sdpa-f32": (sdpa, torch.float32), "sdpa-bf16": (sdpa, torch.bfloat16), "naive-f32": (naive, torch.float32)}


def timed(run, a, cuda):
    """Per-call ms of run(): median and minimum over the repetitions."""
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    kept = [run() for _ in range(2)]
    sync()
    del kept
    ms = []
    for _ in range(max(a.iters, 1)):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            kept = [run() for _ in range(max(a.calls, 1))]
            end.record()
            end.synchronize()
            ms.append(start.elapsed_time(end) / max(a.calls, 1))
        else:
            t0 = time.perf_counter()
            kept = [run() for _ in range(max(a.calls, 1))]
            ms.append((time.perf_counter() - t0) * 1e3 / max(a.calls, 1))
        del kept
    return statistics.median(ms), min(ms)


def measure(name, b, h, t, d, a):
    """{'fwd': (median, min), 'bwd': ..., 'fwd_mib': ..., 'bwd_mib': ...}; a value is 'oom' or 'failed: ...'."""
    f, dtype = IMPLS[name]
    cuda = a.device.startswith("cuda")
    out = {}
    try:
        x = lambda: torch.randn(b, h, t, d, device=a.device, dtype=dtype)  # noqa: E731
        mask = torch.full((t, t), float("-inf"), device=a.device, dtype=dtype).triu(1)
        q, k, v = x(), x(), x()
        for phase in ("fwd", "bwd"):
            if cuda:
                torch.cuda.reset_peak_memory_stats()
            if phase == "fwd":
                with torch.no_grad():
                    out[phase] = timed(lambda: f(q, k, v, mask), a, cuda)
            else:
                q, k, v = (z.requires_grad_() for z in (q, k, v))
                out[phase] = timed(lambda: torch.autograd.grad(f(q, k, v, mask).sum(), (q, k, v)), a, cuda)
            out[phase + "_mib"] = torch.cuda.max_memory_allocated() / 2**20 if cuda else None
    except torch.OutOfMemoryError:
        out.setdefault("fwd", "oom")
        out.setdefault("bwd", "oom")
    except RuntimeError as e:
        reason = "failed: " + str(e).splitlines()[0][:60]
        out.setdefault("fwd", reason)
        out.setdefault("bwd", reason)
    if cuda:
        torch.cuda.empty_cache()
    return out


def main():
    ints = lambda s: [int(v) for v in s.split(",")]  # noqa: E731
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--batch", type=ints, default=[1])
    ap.add_argument("--heads", type=ints, default=[8])
    ap.add_argument("--lengths", type=ints, default=[512, 1024, 2048, 4096, 8192])
    ap.add_argument("--head-dims", type=ints, default=[64, 128])
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--calls", type=int, default=4)
    ap.add_argument("--impls", type=lambda s: s.split(","), default=list(IMPLS))
    ap.add_argument("--max-bht2", type=int, default=0, help="skip shapes with B·h·T² above this (0: none skipped)")
    ap.add_argument("--peak-gflops", type=float, default=0.0, help="adds each rate's percentage of this peak")
    a = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(0)
    where = torch.cuda.get_device_name() if a.device.startswith("cuda") else "cpu"
    print(f"PyTorch {torch.__version__} attention on {where}: causal; per call, median (minimum) of {a.iters} repetitions "
          f"of {a.calls} back-to-back calls and one synchronisation, after 2 untimed calls; GFLOP/s of the median count "
          f"4·B·h·T²·d / 2 for the forward and 3.5× that for forward+backward; memory: peak allocated, inputs included")
    pct = a.peak_gflops > 0
    print("\n| B | h | T | d | path | forward ms | GFLOP/s |" + (" % peak |" if pct else "") + " fwd+bwd ms | GFLOP/s |"
          + (" % peak |" if pct else "") + " peak memory fwd | fwd+bwd |")
    print("|---:|---:|---:|---:|---|---:|---:|" + ("---:|" if pct else "") + "---:|---:|" + ("---:|" if pct else "") + "---:|---:|")
    records = []
    for b in a.batch:
        for h in a.heads:
            for d in a.head_dims:
                for t in a.lengths:
                    if a.max_bht2 and b * h * t * t > a.max_bht2:
                        continue
                    flops = 4 * b * h * t * t * d / 2
                    for name in a.impls:
                        r = measure(name, b, h, t, d, a)
                        cells, fields = [], [f"impl={name} B={b} h={h} T={t} d={d}"]
                        for phase, factor in (("fwd", 1.0), ("bwd", 3.5)):
                            if isinstance(r[phase], str):
                                cells += [r[phase], ""] + ([""] if pct else [])
                                fields.append(f"{phase}_ms={r[phase].split(':')[0]}")
                                continue
                            med, low = r[phase]
                            rate = factor * flops / (med * 1e-3) / 1e9
                            cells += [f"{med:.2f} ({low:.2f})", f"{rate:.1f}"]
                            cells += [f"{100 * rate / a.peak_gflops:.1f}"] if pct else []
                            fields.append(f"{phase}_ms={med:.4f} {phase}_min_ms={low:.4f} {phase}_gflops={rate:.1f}")
                        mib = [r.get(k) for k in ("fwd_mib", "bwd_mib")]
                        cells += [f"{m:.1f} MiB" if m is not None else "n/a" for m in mib]
                        fields += [f"{k}={m:.1f}" for k, m in zip(("fwd_peak_mib", "bwd_peak_mib"), mib) if m is not None]
                        print(f"| {b} | {h} | {t} | {d} | {name} | " + " | ".join(cells) + " |", flush=True)
                        records.append("attention " + " ".join(fields))
    print("\n```text")
    print("\n".join(records))
    print("```")


if __name__ == "__main__":
    main()
