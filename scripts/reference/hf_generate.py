#!/usr/bin/env python3
"""Hugging Face transformers' greedy `generate` (KV cache on, f32 or --dtype bf16/f16), timed the way `ember bench decode --transformers
PYTHON` times Ember: a prompt of N token ids (id_i = (i * 7919 + 13) mod vocab), then M new tokens. Prints
`ttft_s=... decode_tokens_per_s=...`.

The model is a GGUF file (dequantized to f32), or with --config an Ember run config whose [model] is Llama-style
(RMSNorm, RoPE, SwiGLU, no biases), built as LlamaForCausalLM with random weights: speed does not depend on the
values, so a checkpoint's shape can be timed without its weights.

    python3 scripts/reference/hf_generate.py data/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf --prompt-tokens 128 --new-tokens 128
    python3 scripts/reference/hf_generate.py --config configs/smollm2-135m.toml --device cuda --dtype bf16
"""
import argparse
import os
import sys
import time
import tomllib

import torch
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM, logging


DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}


def llama_from_config(path, context, device, dtype):
    """LlamaForCausalLM with random weights in the shape of an Ember config's [model], with Ember's defaults."""
    m = tomllib.load(open(path, "rb"))["model"]
    layout = {"norm": "rmsnorm", "positions": "rope", "ffn": "swiglu", "bias": False}
    wrong = [f"model.{k} = {m.get(k)!r}" for k, v in layout.items() if m.get(k) != v]
    if wrong or m.get("attention", "mha") != "mha" or "window" in m:
        sys.exit(f"error: {path}: --config needs a Llama-style [model] ({', '.join(wrong) or 'MLA or a window'})")
    d, h = m["d_model"], m["n_heads"]
    config = LlamaConfig(
        vocab_size=m.get("vocab_size", 256),  # as `ember bench decode --config`
        hidden_size=d,
        intermediate_size=m.get("d_ff", (8 * d // 3 + 63) // 64 * 64),
        num_hidden_layers=m["n_layers"],
        num_attention_heads=h,
        num_key_value_heads=m.get("n_kv_heads", h),
        head_dim=m.get("head_dim", d // h),
        max_position_embeddings=max(m["block_size"], context),
        rms_norm_eps=m.get("norm_eps", 1e-5),
        rope_theta=m.get("rope_theta", 10000.0),
        tie_word_embeddings=m.get("tie_embeddings", True),
        attention_bias=m.get("qkv_bias", False),
    )
    with torch.device(device):
        return LlamaForCausalLM(config).to(dtype)


parser = argparse.ArgumentParser()
parser.add_argument("gguf", nargs="?")
parser.add_argument("--config", help="an Ember config: its Llama-style [model] with random weights")
parser.add_argument("--prompt-tokens", type=int, default=128)
parser.add_argument("--new-tokens", type=int, default=128)
parser.add_argument("--threads", type=int, default=os.cpu_count())
parser.add_argument("--device", default="cpu")
parser.add_argument("--dtype", choices=DTYPES, default="f32", help="the weights' and activations' type")
args = parser.parse_args()
dtype = DTYPES[args.dtype]
if (args.gguf is None) == (args.config is None):
    parser.error("give a GGUF file or --config FILE")
logging.set_verbosity_error()
torch.set_num_threads(args.threads)
if args.device.startswith("cuda"):
    torch.backends.cuda.matmul.allow_tf32 = False  # plain FP32 products, as Ember's f32
if args.config:
    model = llama_from_config(args.config, args.prompt_tokens + args.new_tokens, args.device, dtype).eval()
else:
    folder, name = os.path.split(os.path.abspath(args.gguf))
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=dtype).to(args.device).eval()
vocab = model.config.vocab_size
ids = torch.tensor([[(i * 7919 + 13) % vocab for i in range(args.prompt_tokens)]], device=args.device)
mask = torch.ones_like(ids)
kwargs = dict(do_sample=False, use_cache=True, attention_mask=mask, pad_token_id=0)


def timed(new_tokens):
    """Seconds for `generate` of `new_tokens` tokens after the prompt (generate reads every token back)."""
    start = time.perf_counter()
    model.generate(ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, **kwargs)
    if args.device.startswith("cuda"):
        torch.cuda.synchronize()
    return time.perf_counter() - start


with torch.inference_mode():
    timed(4)  # warm-up
    ttft = timed(1)
    total = timed(args.new_tokens)
decode = (args.new_tokens - 1) / max(total - ttft, 1e-9)
print(
    f"ttft_s={ttft:.4f} decode_tokens_per_s={decode:.2f} device={args.device} dtype={args.dtype} "
    f"torch={torch.__version__}"
)
