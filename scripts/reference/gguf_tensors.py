#!/usr/bin/env python3
"""Per-tensor conformance fixture for Ember's GGUF reader, from the `gguf` package (llama.cpp's gguf-py): every
tensor of each file given, dequantized by gguf.quants.dequantize, summarised as its element count, the f64 sum and
sum of squares of its f32 values, and the values at eight fixed positions.

    python3 scripts/reference/gguf_tensors.py crates/formats/tests/fixtures/gguf_tensors.json \\
        data/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf data/gemma3/gemma-3-270m-q4_k_m.gguf

Needs numpy and gguf (pip install gguf==0.19.0).
"""
import json
import sys

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize


def positions(n):
    """Eight positions spread over n values (Fibonacci hashing), the same in crates/formats/tests/ggml_blocks.rs."""
    return sorted({(k * 2654435761) % n for k in range(1, 9)})


def main():
    out, files = sys.argv[1], sys.argv[2:]
    fixture = {}
    for path in files:
        tensors = {}
        for t in GGUFReader(path).tensors:
            values = dequantize(np.asarray(t.data), t.tensor_type).astype(np.float32).reshape(-1)
            wide = values.astype(np.float64)
            tensors[t.name] = {
                "type": t.tensor_type.name,
                "n": int(values.size),
                "sum": float(wide.sum()),
                "sumsq": float((wide * wide).sum()),
                "samples": [[i, float(values[i])] for i in positions(values.size)],
            }
        fixture[path.rsplit("/", 1)[-1]] = tensors
    with open(out, "w") as f:
        json.dump({"generator": "scripts/reference/gguf_tensors.py (gguf 0.19.0)", "files": fixture}, f, indent=0)
        f.write("\n")


main()
