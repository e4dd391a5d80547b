#!/usr/bin/env python3
"""PyTorch reference for `ember bench train`: the same GPT (nanoGPT / GPT-2: learned positions, Pre-LN, exact or
tanh GELU, tied output projection, GPT-2 init), the same AdamW parameter groups, global-norm clipping, schedule,
batch and gradient accumulation, on the same corpus split. Prints `tokens_per_s=...` for timed steps (after
warm-up), or with --full trains max_steps and prints the final val loss. Other layouts (RMSNorm, RoPE, SwiGLU,
GQA, ...) are refused rather than trained as something else.

    python3 scripts/reference/gpt_train.py RUN_CONFIG.toml [--steps N] [--warmup W] [--threads 2] [--full]
        [--device cpu|cuda] [--dtype f32|bf16]

Character-level configs are tokenized here; a BPE config reads the token cache (train.bin, val.bin: u32
little-endian) that `ember bench train` writes beside the resolved config. On CUDA, f32 runs with TF32 off (plain
FP32 matrix products, as Ember's f32), bf16 is f32 weights under bf16 autocast, eager; `cuda_peak_mb=` is
torch.cuda.max_memory_allocated.

For Debian's python3-torch (OpenBLAS), OpenBLAS threads are pinned to 1 so they do not fight torch's own threads
(left alone they run at a third of the speed); torch uses --threads threads.
"""
import argparse, math, os, sys, time, tomllib

os.environ["OPENBLAS_NUM_THREADS"] = "1"
for k in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"):
    os.environ.pop(k, None)
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402


class Attention(nn.Module):
    def __init__(s, d, h, bias, block):
        super().__init__()
        s.c_attn, s.c_proj, s.h = nn.Linear(d, 3 * d, bias=bias), nn.Linear(d, d, bias=bias), h
        s.register_buffer("mask", torch.tril(torch.ones(block, block, dtype=torch.bool)))

    def forward(s, x):
        b, t, c = x.shape
        q, k, v = (z.view(b, t, s.h, c // s.h).transpose(1, 2) for z in s.c_attn(x).split(c, dim=2))
        if hasattr(F, "scaled_dot_product_attention"):
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            y = F.softmax(att.masked_fill(~s.mask[:t, :t], float("-inf")), dim=-1) @ v
        return s.c_proj(y.transpose(1, 2).contiguous().view(b, t, c))


class Block(nn.Module):
    def __init__(s, d, h, bias, block, gelu):
        super().__init__()
        s.ln_1, s.attn = nn.LayerNorm(d, elementwise_affine=True), Attention(d, h, bias, block)
        s.ln_2 = nn.LayerNorm(d)
        s.c_fc, s.c_proj, s.gelu = nn.Linear(d, 4 * d, bias=bias), nn.Linear(4 * d, d, bias=bias), nn.GELU(approximate=gelu)

    def forward(s, x):
        x = x + s.attn(s.ln_1(x))
        return x + s.c_proj(s.gelu(s.c_fc(s.ln_2(x))))


class GPT(nn.Module):
    def __init__(s, vocab, m):
        super().__init__()
        d = m["d_model"]
        s.wte, s.wpe = nn.Embedding(vocab, d), nn.Embedding(m["block_size"], d)
        gelu = "tanh" if m.get("ffn", "gelu") == "gelu_tanh" else "none"
        s.blocks = nn.ModuleList(Block(d, m["n_heads"], m.get("bias", True), m["block_size"], gelu) for _ in range(m["n_layers"]))
        s.ln_f = nn.LayerNorm(d)
        for name, p in s.named_parameters():
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * m["n_layers"]) if name.endswith("c_proj.weight") else 0.02
                nn.init.normal_(p, 0.0, std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(s, idx):
        x = s.wte(idx) + s.wpe(torch.arange(idx.size(1), device=idx.device))
        for blk in s.blocks:
            x = blk(x)
        return s.ln_f(x) @ s.wte.weight.t()


def unsupported(m):
    """The [model] settings this reference does not implement (it would train another model)."""
    d, h, bias = m["d_model"], m["n_heads"], m.get("bias", True)
    ok = {
        "norm": m.get("norm", "layernorm") == "layernorm",
        "norm_placement": m.get("norm_placement", "pre") == "pre",
        "positions": m.get("positions", "learned") == "learned",
        "attention": m.get("attention", "mha") == "mha",
        "ffn": m.get("ffn", "gelu") in ("gelu", "gelu_tanh"),
        "n_kv_heads": m.get("n_kv_heads", h) == h,
        "head_dim": m.get("head_dim", d // h) * h == d,
        "d_ff": m.get("d_ff", 4 * d) == 4 * d,
        "qkv_bias": m.get("qkv_bias", bias) == bias,
        "window": "window" not in m,
        "dropout": m.get("dropout", 0.0) == 0.0,
        "attention_dropout": m.get("attention_dropout", 0.0) == 0.0,
    }
    return [f"model.{k} = {m[k]!r}" for k, good in ok.items() if not good]


def tokens(cfg, config_path):
    """(train ids, val ids, vocabulary size) as Ember splits them."""
    d, m = cfg["data"], cfg["model"]
    if d["tokenizer"] == "char":
        text = open(d["corpus"], encoding="utf-8").read()
        chars = sorted(set(text))
        lookup = {c: i for i, c in enumerate(chars)}
        data = torch.tensor([lookup[c] for c in text], dtype=torch.long)
        n = int((1 - d.get("val_fraction", 0.1)) * len(data))
        return data[:n], data[n:], max(len(chars), m.get("vocab_size", 0))
    folder = os.path.dirname(os.path.abspath(config_path))
    cache = [os.path.join(folder, f) for f in ("train.bin", "val.bin")]
    if not all(os.path.exists(f) for f in cache):
        sys.exit(f"error: a {d['tokenizer']} config needs the token cache train.bin / val.bin beside it (ember bench train writes it)")
    train, val = (torch.from_file(f, size=os.path.getsize(f) // 4, dtype=torch.int32).long() for f in cache)
    return train, val, m["vocab_size"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("config")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--full", action="store_true")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", choices=["f32", "bf16"], default="f32")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    cuda = a.device.startswith("cuda")
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    cfg = tomllib.load(open(a.config, "rb"))
    m, t = cfg["model"], cfg["train"]
    if unsupported(m):
        sys.exit(f"error: the PyTorch reference implements the GPT-2 layout only, not {', '.join(unsupported(m))}")
    train, val, vocab = tokens(cfg, a.config)
    train, val = train.to(a.device), val.to(a.device)
    torch.manual_seed(t.get("seed", 1337))
    model = GPT(vocab, m).to(a.device)
    decay = [p for n_, p in model.named_parameters() if p.dim() == 2 and (t.get("decay_embeddings", True) or not n_.startswith(("wte", "wpe")))]
    rest = [p for p in model.parameters() if all(p is not q for q in decay)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": t.get("weight_decay", 0.0)}, {"params": rest, "weight_decay": 0.0}],
                            lr=t["lr"], betas=(t.get("beta1", 0.9), t.get("beta2", 0.999)), eps=t.get("eps", 1e-8))
    b, T, accum = t["batch_size"], t.get("seq_len", m["block_size"]), t.get("grad_accum", 1)
    offsets = torch.arange(T, device=a.device)

    def batch(split):
        ix = torch.randint(len(split) - T, (b, 1), device=a.device)
        return split[ix + offsets], split[ix + 1 + offsets]

    def loss_of(x, y):
        with torch.autocast(device_type=torch.device(a.device).type, dtype=torch.bfloat16, enabled=a.dtype == "bf16"):
            return F.cross_entropy(model(x).view(-1, vocab).float(), y.view(-1))

    def lr_at(s):
        w, dec, lr, mn = t.get("warmup_steps", 0), t.get("decay_steps", t["max_steps"]), t["lr"], t.get("min_lr", 0.0)
        if s < w:
            return lr * (s + 1) / (w + 1)
        if s >= dec:
            return mn
        return mn + 0.5 * (1 + math.cos(math.pi * (s - w) / (dec - w))) * (lr - mn)

    def step(s):
        for g in opt.param_groups:
            g["lr"] = lr_at(s)
        opt.zero_grad(set_to_none=True)
        for _ in range(accum):
            loss = loss_of(*batch(train)) / accum
            loss.backward()
        if t.get("grad_clip", 0.0) > 0:
            nn.utils.clip_grad_norm_(model.parameters(), t["grad_clip"])
        opt.step()
        return loss.item() * accum

    if a.full:
        start = time.time()
        for s in range(t["max_steps"]):
            step(s)
        model.eval()
        with torch.no_grad():
            losses = [loss_of(*batch(val)).item() for _ in range(t["eval_iters"])]
        print(f"val_loss={sum(losses) / len(losses):.4f} seconds={time.time() - start:.1f}")
        return
    for s in range(a.warmup):
        step(s)
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    start = time.time()
    for s in range(a.warmup, a.warmup + a.steps):
        step(s)
    if cuda:
        torch.cuda.synchronize()
    elapsed = time.time() - start
    import resource
    memory = f" cuda_peak_mb={torch.cuda.max_memory_allocated() / 2**20:.1f}" if cuda else ""
    print(f"tokens_per_s={a.steps * accum * b * T / elapsed:.1f} peak_rss_mb={resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.1f}{memory} "
          f"device={a.device} dtype={a.dtype} torch={torch.__version__}")


if __name__ == "__main__":
    main()
