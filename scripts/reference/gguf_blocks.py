#!/usr/bin/env python3
"""Conformance fixture for Ember's GGUF block dequantizers, from the `gguf` package (llama.cpp's gguf-py).

For every block format Ember reads (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K, F16, BF16): three blocks of
random quantized bytes with finite half-precision scales, and the f32 values gguf.quants.dequantize gives them; then,
for each tensor type present in the GGUF files given, the first two blocks of the first tensor of that type and
their values. Written as JSON: {"blocks": [{"type": NAME, "ggml_type": ID, "bytes": HEX, "values": [...]}]}.

    python3 scripts/reference/gguf_blocks.py crates/formats/tests/fixtures/gguf_blocks.json [FILE.gguf ...]

Needs numpy and gguf (pip install gguf==0.19.0).
"""
import json
import sys

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import GGUFReader
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import dequantize

# Byte offsets of each format's f16 scale fields within a block (random bytes there could be inf or NaN).
SCALES = {
    T.Q8_0: [0], T.Q4_0: [0], T.Q4_1: [0, 2], T.Q5_0: [0], T.Q5_1: [0, 2],
    T.Q4_K: [0, 2], T.Q5_K: [0, 2], T.Q6_K: [208], T.F16: None, T.BF16: None,
}


def random_blocks(qtype, rng, count=3):
    block, size = GGML_QUANT_SIZES[qtype]
    raw = bytearray(rng.integers(0, 256, size * count, dtype=np.uint8).tobytes())
    if qtype == T.F16:
        raw = bytearray(rng.normal(0, 2, count * block).astype(np.float16).tobytes())
    elif qtype == T.BF16:
        raw = bytearray((rng.normal(0, 2, count * block).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16).tobytes())
    else:
        for b in range(count):
            for at in SCALES[qtype]:
                scale = np.float16(rng.uniform(-0.05, 0.05) if at > 0 and qtype in (T.Q4_1, T.Q5_1) else rng.uniform(0.001, 0.02))
                raw[b * size + at: b * size + at + 2] = scale.tobytes()
    return bytes(raw)


def entry(qtype, raw, origin):
    values = dequantize(np.frombuffer(raw, dtype=np.uint8), qtype).astype(np.float32).reshape(-1)
    return {"type": qtype.name, "ggml_type": int(qtype), "origin": origin, "bytes": raw.hex(),
            "values": [float(v) for v in values]}


def main():
    out, files = sys.argv[1], sys.argv[2:]
    rng = np.random.default_rng(7)
    blocks = [entry(q, random_blocks(q, rng), "random") for q in SCALES]
    for path in files:
        seen = set()
        for tensor in GGUFReader(path).tensors:
            qtype = tensor.tensor_type
            if qtype == T.F32 or qtype in seen:
                continue
            seen.add(qtype)
            _, size = GGML_QUANT_SIZES[qtype]
            raw = bytes(np.asarray(tensor.data).view(np.uint8).reshape(-1)[: 2 * size])
            blocks.append(entry(qtype, raw, f"{path.rsplit('/', 1)[-1]}:{tensor.name}"))
    with open(out, "w") as f:
        json.dump({"generator": "scripts/reference/gguf_blocks.py (gguf 0.19.0)", "blocks": blocks}, f)
        f.write("\n")


main()
