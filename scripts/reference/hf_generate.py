#!/usr/bin/env python3
"""Hugging Face transformers' greedy `generate` on a GGUF model (dequantized to f32, KV cache on), timed the way
`ember bench decode --transformers PYTHON` times Ember: a prompt of N token ids (id_i = (i * 7919 + 13) mod vocab),
then M new tokens. Prints `ttft_s=... decode_tokens_per_s=...`.

    python3 scripts/reference/hf_generate.py data/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf --prompt-tokens 128 --new-tokens 128
"""
import argparse
import os
import time

import torch
from transformers import AutoModelForCausalLM, logging

parser = argparse.ArgumentParser()
parser.add_argument("gguf")
parser.add_argument("--prompt-tokens", type=int, default=128)
parser.add_argument("--new-tokens", type=int, default=128)
parser.add_argument("--threads", type=int, default=os.cpu_count())
args = parser.parse_args()
logging.set_verbosity_error()
torch.set_num_threads(args.threads)
folder, name = os.path.split(os.path.abspath(args.gguf))
model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32).eval()
vocab = model.config.vocab_size
ids = torch.tensor([[(i * 7919 + 13) % vocab for i in range(args.prompt_tokens)]])
mask = torch.ones_like(ids)
kwargs = dict(do_sample=False, use_cache=True, attention_mask=mask, pad_token_id=0)
with torch.inference_mode():
    model.generate(ids, max_new_tokens=4, min_new_tokens=4, **kwargs)  # warm-up
    start = time.perf_counter()
    model.generate(ids, max_new_tokens=1, min_new_tokens=1, **kwargs)
    ttft = time.perf_counter() - start
    start = time.perf_counter()
    model.generate(ids, max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens, **kwargs)
    total = time.perf_counter() - start
decode = (args.new_tokens - 1) / max(total - ttft, 1e-9)
print(f"ttft_s={ttft:.4f} decode_tokens_per_s={decode:.2f}")
