"""Hugging Face transformers' reading of Gemma 3 270M's GGUF file (weights dequantized to f32), as the fixture Ember's
Gemma 3 import is compared against:

- tokenization of the README's three prompts and a text with every kind of piece (spaces, digits, punctuation, an
  emoji, a newline, bytes outside the vocabulary), each with the BOS token the file asks for;
- the last position's logits for the first prompt at 64 token ids (the 16 largest and 48 spread over the vocabulary),
  their argmax, mean and standard deviation;
- 16 greedy tokens for each prompt.

    python3 scripts/reference/gemma3_fixture.py crates/core-model/tests/fixtures/gemma3.json \
        data/gemma3/gemma-3-270m-q4_k_m.gguf

Needs transformers (5.25), torch, gguf and accelerate.
"""
import json
import os
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

PROMPTS = ["The capital of France is", "Once upon a time,", "def fibonacci(n):"]
TEXTS = PROMPTS + ["  Two  spaces, 3.14159 and 2026; café 東京 🦀\n\tend\u0001"]


def main(out_path, gguf_path):
    torch.manual_seed(0)
    folder, name = os.path.split(os.path.abspath(gguf_path))
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32).eval()
    tokens = [{"text": t, "ids": tok(t, return_tensors="pt").input_ids[0].tolist()} for t in TEXTS]
    ids = tok(PROMPTS[0], return_tensors="pt").input_ids
    with torch.no_grad():
        last = model(ids).logits[0, -1].double()
    vocab = last.shape[0]
    top = torch.topk(last, 16).indices.tolist()
    spread = [(k * 2_654_435_761) % vocab for k in range(1, 49)]
    picked = top + spread
    records = []
    for prompt in PROMPTS:
        ids = tok(prompt, return_tensors="pt").input_ids
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=16, do_sample=False)
        new = out[0, ids.shape[1]:].tolist()
        records.append({"prompt": prompt, "prompt_ids": ids[0].tolist(), "greedy_ids": new,
                        "greedy_text": tok.decode(new)})
    fixture = {
        "tokens": tokens,
        "logits": {"prompt": PROMPTS[0], "ids": picked, "values": [last[i].item() for i in picked],
                   "argmax": int(last.argmax()), "mean": last.mean().item(), "std": last.std().item()},
        "records": records,
    }
    with open(out_path, "w") as f:
        json.dump(fixture, f, indent=1, ensure_ascii=False)
    print(json.dumps(records, ensure_ascii=False)[:600])


if __name__ == "__main__":
    main(*sys.argv[1:])
