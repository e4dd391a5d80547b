#!/usr/bin/env python3
"""PyTorch reference for `ember bench train`: the same GPT (nanoGPT / GPT-2: learned positions, Pre-LN, exact GELU,
tied output projection, GPT-2 init), the same AdamW parameter groups, global-norm clipping, schedule and batch,
on the same char-level corpus split. Prints `tokens_per_s=...` for timed steps (after warm-up), or with
--full trains max_steps and prints the final val loss.

    python3 scripts/reference/gpt_train.py RUN_CONFIG.toml [--steps N] [--warmup W] [--threads 2] [--full]

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
    def __init__(s, d, h, bias, block):
        super().__init__()
        s.ln_1, s.attn = nn.LayerNorm(d, elementwise_affine=True), Attention(d, h, bias, block)
        s.ln_2 = nn.LayerNorm(d)
        s.c_fc, s.c_proj, s.gelu = nn.Linear(d, 4 * d, bias=bias), nn.Linear(4 * d, d, bias=bias), nn.GELU()

    def forward(s, x):
        x = x + s.attn(s.ln_1(x))
        return x + s.c_proj(s.gelu(s.c_fc(s.ln_2(x))))


class GPT(nn.Module):
    def __init__(s, vocab, m):
        super().__init__()
        d = m["d_model"]
        s.wte, s.wpe = nn.Embedding(vocab, d), nn.Embedding(m["block_size"], d)
        s.blocks = nn.ModuleList(Block(d, m["n_heads"], m.get("bias", True), m["block_size"]) for _ in range(m["n_layers"]))
        s.ln_f = nn.LayerNorm(d)
        for name, p in s.named_parameters():
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * m["n_layers"]) if name.endswith("c_proj.weight") else 0.02
                nn.init.normal_(p, 0.0, std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(s, idx):
        x = s.wte(idx) + s.wpe(torch.arange(idx.size(1)))
        for blk in s.blocks:
            x = blk(x)
        return s.ln_f(x) @ s.wte.weight.t()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("config")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--full", action="store_true")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    cfg = tomllib.load(open(a.config, "rb"))
    m, d, t = cfg["model"], cfg["data"], cfg["train"]
    if d["tokenizer"] != "char":
        sys.exit("error: the PyTorch reference supports data.tokenizer = \"char\" only")
    text = open(d["corpus"], encoding="utf-8").read()
    chars = sorted(set(text))
    lookup = {c: i for i, c in enumerate(chars)}
    data = torch.tensor([lookup[c] for c in text], dtype=torch.long)
    n = int((1 - d.get("val_fraction", 0.1)) * len(data))
    train, val = data[:n], data[n:]
    torch.manual_seed(t.get("seed", 1337))
    model = GPT(len(chars), m)
    decay = [p for n_, p in model.named_parameters() if p.dim() == 2 and (t.get("decay_embeddings", True) or not n_.startswith(("wte", "wpe")))]
    rest = [p for p in model.parameters() if all(p is not q for q in decay)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": t.get("weight_decay", 0.0)}, {"params": rest, "weight_decay": 0.0}],
                            lr=t["lr"], betas=(t.get("beta1", 0.9), t.get("beta2", 0.999)), eps=t.get("eps", 1e-8))
    b, T = t["batch_size"], t.get("seq_len", m["block_size"])

    def batch(split):
        ix = torch.randint(len(split) - T, (b,))
        return torch.stack([split[i:i + T] for i in ix]), torch.stack([split[i + 1:i + 1 + T] for i in ix])

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
        x, y = batch(train)
        loss = F.cross_entropy(model(x).view(-1, len(chars)), y.view(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if t.get("grad_clip", 0.0) > 0:
            nn.utils.clip_grad_norm_(model.parameters(), t["grad_clip"])
        opt.step()
        return loss.item()

    if a.full:
        start = time.time()
        for s in range(t["max_steps"]):
            step(s)
        model.eval()
        with torch.no_grad():
            losses = [F.cross_entropy(model(x).view(-1, len(chars)), y.view(-1)).item() for x, y in (batch(val) for _ in range(t["eval_iters"]))]
        print(f"val_loss={sum(losses) / len(losses):.4f} seconds={time.time() - start:.1f}")
        return
    for s in range(a.warmup):
        step(s)
    start = time.time()
    for s in range(a.warmup, a.warmup + a.steps):
        step(s)
    elapsed = time.time() - start
    import resource
    print(f"tokens_per_s={a.steps * b * T / elapsed:.1f} peak_rss_mb={resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.1f} torch={torch.__version__}")


if __name__ == "__main__":
    main()
