"""Corpus BLEU fixtures from the sacrebleu package (default settings: 13a, exp smoothing), for
crates/train/tests/bleu.rs. References: the first 120 Spanish verses of bible-en-es/test.tsv plus lines that exercise
the tokenizer; hypotheses: deterministic corruptions of them (dropped, swapped and replaced words, truncations,
empty lines). Usage: python scripts/reference/bleu_fixture.py [DATA_DIR] > crates/train/tests/fixtures/bleu/cases.json
"""
import json
import random
import sys

import sacrebleu

data = sys.argv[1] if len(sys.argv) > 1 else "data/bible-en-es"
refs = [line.rstrip("\n").split("\t")[1] for line in open(f"{data}/test.tsv", encoding="utf-8")][:120]
refs += [
    "It costs $1,000.50 -- or 3-4 days' wages (roughly).",
    "&quot;Yes,&quot; she said &amp; left; 2.5% of 10,000 is 250.",
    "Él dijo: «¿Qué es esto?» — y se fue... a las 10:30.",
    "e-mail: juan@example.com / web: http://example.com/a-b?c=d",
]


def corrupt(line, rng, strength):
    words = line.split()
    out = []
    for w in words:
        r = rng.random()
        if r < strength * 0.3:
            continue
        if r < strength * 0.5:
            out.append(rng.choice(words))
        elif r < strength * 0.6:
            out.append(w.upper())
        else:
            out.append(w)
    if rng.random() < strength * 0.3:
        out = out[: max(1, len(out) // 2)]
    if out and rng.random() < strength * 0.5:
        i = rng.randrange(len(out))
        j = rng.randrange(len(out))
        out[i], out[j] = out[j], out[i]
    return " ".join(out)


cases = []
for name, strength, seed in [("light", 0.2, 1), ("heavy", 0.8, 2), ("short", 1.0, 3)]:
    rng = random.Random(seed)
    hyps = [corrupt(r, rng, strength) for r in refs]
    if name == "short":
        hyps = [h.split()[0] if h.split() and i % 3 else "" for i, h in enumerate(hyps)]
    bleu = sacrebleu.corpus_bleu(hyps, [refs])
    cases.append({"name": name, "hyps": hyps, "refs": refs, "bleu": bleu.score,
                  "correct": bleu.counts, "total": bleu.totals, "hyp_len": bleu.sys_len, "ref_len": bleu.ref_len,
                  "tokenized": [sacrebleu.tokenizers.tokenizer_13a.Tokenizer13a()(r) for r in refs[-4:]]})
json.dump({"sacrebleu": sacrebleu.__version__, "cases": cases}, sys.stdout, ensure_ascii=False, indent=1)
