#!/usr/bin/env python3
"""Compares two lm-evaluation-harness runs of one multiple-choice task item by item, from their --log_samples files:
the largest difference between the log-likelihoods each gives the same (item, choice), and both accuracies. Exits 1
when a log-likelihood differs by more than TOL or an item is answered differently.

    python3 scripts/lm-eval/compare.py HF_OUT EMBER_OUT [TOL]
"""
import glob
import json
import sys


def samples(out):
    files = glob.glob(f"{out}/**/samples_*.jsonl", recursive=True)
    if len(files) != 1:
        sys.exit(f"expected one samples_*.jsonl under {out}, found {files}")
    docs = [json.loads(line) for line in open(files[0])]
    return {d["doc_id"]: d for d in docs}


def main(hf_out, ember_out, tol=1e-3):
    hf, ember = samples(hf_out), samples(ember_out)
    if hf.keys() != ember.keys():
        sys.exit("the runs scored different items")
    worst, differ, right = 0.0, 0, [0, 0]
    for doc_id, h in hf.items():
        e = ember[doc_id]
        lh = [r[0][0] for r in h["resps"]]
        le = [r[0][0] for r in e["resps"]]
        worst = max(worst, max(abs(float(a) - float(b)) for a, b in zip(lh, le)))
        pick_h, pick_e = lh.index(max(lh)), le.index(max(le))
        differ += pick_h != pick_e
        right[0] += h["acc"]
        right[1] += e["acc"]
    n = len(hf)
    print(f"items {n}, choices {sum(len(d['resps']) for d in hf.values())}")
    print(f"max |log-likelihood difference| {worst:.2e} (tolerance {tol:g})")
    print(f"accuracy: hf {right[0] / n:.4f}, ember {right[1] / n:.4f}; items answered differently: {differ}")
    if worst > tol or differ:
        sys.exit(1)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], *(float(a) for a in sys.argv[3:]))
