#!/usr/bin/env python3
"""`ember export` checked by the tools users take its files to: a GGUF file (here SmolLM2-135M-Instruct Q4_1) exported
as a Hugging Face directory and as GGUF files (its own Q4_1 blocks, f32, q8_0), each loaded by transformers (the
directory with from_pretrained; the GGUF files through transformers' reader, which uses the `gguf` package), against
transformers' own model of the source file: logits over three prompts, 24 greedy tokens, token ids, and the chat
template's rendering.

    python3 scripts/reference/export_check.py target/release/ember data/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf

Needs torch, transformers and gguf. Prints one line per exported file and exits non-zero when a check fails.
"""
import os
import subprocess
import sys
import tempfile

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from hf_fixtures import gguf_model

PROMPTS = [
    "The capital of France is",
    "To be, or not to be, that is the question:",
    "def add(a, b):\n    return a + b\n",
]
CHAT = [{"role": "system", "content": "You are brief."}, {"role": "user", "content": "Name a colour."}]


def run(tok, model):
    """Logits of each prompt and 24 greedy tokens after the first."""
    logits, ids = [], tok(PROMPTS[0], return_tensors="pt").input_ids
    with torch.no_grad():
        for prompt in PROMPTS:
            logits.append(model(tok(prompt, return_tensors="pt").input_ids).logits[0])
        greedy = model.generate(ids, max_new_tokens=24, do_sample=False)[0].tolist()
    return logits, greedy


def main(ember, gguf_path):
    tok, reference = gguf_model(gguf_path)
    want_logits, want_greedy = run(tok, reference)
    failed = False
    with tempfile.TemporaryDirectory() as tmp:
        outputs = [("hf", os.path.join(tmp, "hf"), "f32")]
        outputs += [("gguf", os.path.join(tmp, f"{t}.gguf"), t) for t in ("native", "f32", "q8_0")]
        for to, out, kind in outputs:
            subprocess.run([ember, "export", "--to", to, "--type", kind, gguf_path, out], check=True,
                           stdout=subprocess.DEVNULL)
            if to == "hf":
                got_tok = AutoTokenizer.from_pretrained(out)
                model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
            else:
                got_tok, model = gguf_model(out)
            logits, greedy = run(got_tok, model)
            diff = max((a - b).abs().max().item() for a, b in zip(logits, want_logits))
            same_ids = all(got_tok(p).input_ids == tok(p).input_ids for p in PROMPTS)
            same_chat = got_tok.apply_chat_template(CHAT, tokenize=False) == tok.apply_chat_template(CHAT, tokenize=False)
            # Re-quantizing to q8_0 changes the weights; everything else must be the source's model.
            bound = 1e-4 if kind != "q8_0" else float("inf")
            ok = diff <= bound and same_ids and same_chat and (greedy == want_greedy or kind == "q8_0")
            failed |= not ok
            size = sum(os.path.getsize(os.path.join(out, f)) for f in os.listdir(out)) if os.path.isdir(out) \
                else os.path.getsize(out)
            print(f"{to} {kind:6} {size / 1e6:7.1f} MB: max |logit diff| {diff:.3g}, greedy "
                  f"{'same' if greedy == want_greedy else 'differs'}, token ids {'same' if same_ids else 'differ'}, "
                  f"chat template {'same' if same_chat else 'differs'}{'' if ok else '  FAILED'}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main(*sys.argv[1:])
