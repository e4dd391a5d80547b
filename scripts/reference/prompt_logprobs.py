#!/usr/bin/env python3
"""Prompt log-probabilities from Hugging Face transformers, for `ember serve`'s completions `echo`: SmolLM2-135M-Instruct
(the GGUF's weights dequantized to f32 by transformers) scores each prompt's tokens, log softmax(logits)[t-1][id_t]
for t ≥ 1, with the most likely token at each position and its log-probability.

    python3 scripts/reference/prompt_logprobs.py data/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf \
        crates/ember/tests/fixtures/smollm2_prompt_logprobs.json

Needs torch, transformers and gguf.
"""
import json
import os
import sys

import torch

from hf_fixtures import gguf_model

PROMPTS = [
    "The capital of France is Paris, and the capital of Italy is Rome.",
    "To be, or not to be, that is the question:",
    "def add(a, b):\n    return a + b\n",
]


def main(gguf_path, out_path):
    tok, model = gguf_model(gguf_path)
    records = []
    for prompt in PROMPTS:
        ids = tok(prompt, return_tensors="pt").input_ids
        with torch.no_grad():
            logprobs = torch.log_softmax(model(ids).logits[0].double(), dim=-1)
        rows = range(ids.shape[1] - 1)
        records.append({
            "prompt": prompt,
            "ids": ids[0].tolist(),
            "logprobs": [float(logprobs[t, ids[0, t + 1]]) for t in rows],
            "top_ids": [int(logprobs[t].argmax()) for t in rows],
            "top_logprobs": [float(logprobs[t].max()) for t in rows],
        })
        print(prompt, "sum", sum(records[-1]["logprobs"]))
    with open(out_path, "w") as f:
        json.dump({"model": f"{os.path.basename(gguf_path)} dequantized to f32", "records": records}, f, indent=1)


if __name__ == "__main__":
    main(*sys.argv[1:])
