#!/usr/bin/env python3
"""Reference encodings for the splits byte-level BPE files name in GGUF's tokenizer.ggml.pre.

A small byte-level BPE (GPT-2's byte alphabet, 400 tokens, <|endoftext|> first) is trained with the `tokenizers`
library; its tokens and merges are what a GGUF file stores. Each case text is then encoded the way the model family
does it upstream:
- qwen2: transformers' own Qwen2Tokenizer built from that vocabulary and those merges (NFC, Qwen's split regex with
  each digit alone, byte-level without its own split);
- llama-bpe: Llama 3's tokenizer.json pre-tokenizer (its split regex with digits in threes, then byte-level);
- smollm: SmolLM's (digits one by one, then GPT-2's byte-level split);
- gpt-2: GPT-2's byte-level split alone.

    python3 scripts/reference/bpe_pretokenizers.py crates/formats/tests/fixtures/bpe_pretokenizers.json

Needs transformers and tokenizers.
"""
import json
import sys

from tokenizers import Regex, Tokenizer, models, pre_tokenizers, trainers
from transformers.models.qwen2.tokenization_qwen2 import Qwen2Tokenizer

CORPUS = [
    "The capital of France is Paris, and the capital of Spain is Madrid.",
    "Once upon a time, a small model learned to read its own weights (all 1234567 of them).",
    "I'm sure they'll say it's theirs; WE'LL see. DON'T you think so?",
    "def fibonacci(n): return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)",
    "Prices rose 12.5% in 2024 -- from $1,000 to $1,125!\n\n\tIndented line\r\nWindows line",
    "Ünïcödé café naïve résumé — “quotes” and ‘apostrophes’; 東京 is Tokyo; ﬁ ligature.",
]
CASES = [
    "Hello world",
    "(hello) [world] {x}",
    "I'M HERE, you're there; THEY'VE gone.",
    "12345 and 3.14159 and 1,000,000",
    "  leading spaces and trailing spaces   ",
    "line one\nline two\r\n\n  indented",
    "café cafe\u0301 naïve",
    "fibonacci(n - 1) + fibonacci(n - 2)",
    "$1,125!!! ...wait??",
    "東京 Tokyo 2024年",
]
SPLITS = {
    "llama-bpe": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
}


def main(out):
    base = Tokenizer(models.BPE())
    base.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    base.train_from_iterator(CORPUS, trainer)
    model = json.loads(base.to_str())["model"]
    vocab, merges = model["vocab"], [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]

    def with_pre(pre):
        tok = Tokenizer(models.BPE(vocab=vocab, merges=[tuple(m.split(" ", 1)) for m in merges]))
        tok.pre_tokenizer = pre
        return lambda text: tok.encode(text, add_special_tokens=False).ids

    qwen2 = Qwen2Tokenizer(vocab=vocab, merges=[tuple(m.split(" ", 1)) for m in merges])
    encoders = {
        "qwen2": lambda text: qwen2.encode(text, add_special_tokens=False),
        "llama-bpe": with_pre(pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(SPLITS["llama-bpe"]), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])),
        "smollm": with_pre(pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)])),
        "gpt-2": with_pre(pre_tokenizers.ByteLevel(add_prefix_space=False)),
    }
    cases = {name: [[text, encode(text)] for text in CASES] for name, encode in encoders.items()}
    # The splits must disagree somewhere, or the cases would not tell them apart.
    assert len({json.dumps(c) for c in cases.values()}) == len(cases)
    with open(out, "w") as f:
        json.dump({"tokens": tokens, "merges": merges, "cases": cases}, f, ensure_ascii=False, indent=0)
    print(out, len(tokens), "tokens", len(merges), "merges")


if __name__ == "__main__":
    main(sys.argv[1])
