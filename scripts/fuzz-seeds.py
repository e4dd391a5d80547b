#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz targets into fuzz/corpus/<target>/: small valid inputs of each format, from
the checkout's own configs and fixtures and, where data/ holds it, the head of the SmolLM2 GGUF file. Standard
library only; the seeds are committed, so this runs again only when a format gains something to cover.

    scripts/fuzz-seeds.py
"""
import json
import struct
from pathlib import Path

root = Path(__file__).resolve().parent.parent
corpus = root / "fuzz" / "corpus"


def seed(target, name, data):
    path = corpus / target / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data if isinstance(data, bytes) else data.encode())


# --- GGUF: a tiny llama file with every supported tensor type and every metadata value type ----------------------
def gguf_string(s):
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def gguf_value(kind, v):
    fmt = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
    if kind == 8:
        return gguf_string(v)
    if kind == 9:
        item, values = v
        return struct.pack("<IQ", item, len(values)) + b"".join(gguf_value(item, x) for x in values)
    return struct.pack(fmt[kind], v)


def gguf_file(metadata, tensors, alignment=32):
    out = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(metadata))
    for key, (kind, v) in metadata.items():
        out += gguf_string(key) + struct.pack("<I", kind) + gguf_value(kind, v)
    data, offsets = b"", []
    for _, _, _, raw in tensors:
        data += b"\0" * (-len(data) % alignment)
        offsets.append(len(data))
        data += raw
    for (name, dims, ggml_type, _), offset in zip(tensors, offsets):
        out += gguf_string(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
        out += struct.pack("<IQ", ggml_type, offset)
    out += b"\0" * (-len(out) % alignment)
    return out + data


tokens = ["<|endoftext|>", "a", "b", "c", "ab", "Ġ", "Ġa", "bc"]
metadata = {
    "general.architecture": (8, "llama"),
    "general.alignment": (4, 32),
    "llama.block_count": (4, 1),
    "llama.context_length": (4, 64),
    "llama.embedding_length": (4, 8),
    "llama.feed_forward_length": (4, 16),
    "llama.attention.head_count": (4, 2),
    "llama.attention.head_count_kv": (4, 1),
    "llama.attention.layer_norm_rms_epsilon": (6, 1e-5),
    "llama.rope.freq_base": (12, 10000.0),
    "tokenizer.ggml.model": (8, "gpt2"),
    "tokenizer.ggml.pre": (8, "smollm"),
    "tokenizer.ggml.tokens": (9, (8, tokens)),
    "tokenizer.ggml.merges": (9, (8, ["a b", "b c", "Ġ a"])),
    "tokenizer.ggml.token_type": (9, (5, [3] + [1] * (len(tokens) - 1))),
    "tokenizer.ggml.scores": (9, (6, [0.0] * len(tokens))),
    "misc.bytes": (9, (0, [1, 2, 3])),
    "misc.signed": (9, (11, [-1, 2])),
    "misc.nested": (9, (9, [(4, [1, 2]), (7, [True])])),
    "misc.flags": (9, (7, [True, False])),
    "misc.small": (1, -3),
    "misc.short": (3, -300),
    "misc.ushort": (2, 300),
    "misc.bool": (7, True),
    "misc.wide": (10, 1 << 40),
    "misc.int": (5, -7),
}
block = lambda: struct.pack("<e", 0.5)
tensors = [
    ("token_embd.weight", [8, 8], 0, struct.pack("<64f", *[i / 64 for i in range(64)])),
    ("output_norm.weight", [8], 1, struct.pack("<8e", *[1.0] * 8)),
    ("blk.0.attn_q.weight", [32, 2], 8, (block() + bytes(range(32))) * 2),
    ("blk.0.attn_k.weight", [32, 1], 2, block() + bytes(range(16))),
    ("blk.0.attn_v.weight", [32, 1], 3, block() + struct.pack("<e", -1.0) + bytes(range(16))),
    ("blk.0.ffn_norm.weight", [8], 30, struct.pack("<8H", *[0x3F80] * 8)),
]
seed("gguf", "tiny-llama.gguf", gguf_file(metadata, tensors))
seed("gguf", "empty.gguf", gguf_file({}, []))
# One tensor of each 5-bit and K-quant format (bytes per block: Q5_0 22, Q5_1 24, Q4_K 144, Q5_K 176, Q6_K 210).
half = lambda x: struct.pack("<e", x)
kquants = [
    ("q5_0", [32], 6, half(0.5) + bytes(range(20))),
    ("q5_1", [32], 7, half(0.5) + half(-1.0) + bytes(range(20))),
    ("q4_k", [256], 12, half(0.5) + half(0.25) + bytes(range(140))),
    ("q5_k", [256], 13, half(0.5) + half(0.25) + bytes(range(172))),
    ("q6_k", [256], 14, bytes(range(208)) + half(0.5)),
]
seed("gguf", "kquants.gguf", gguf_file({"general.alignment": (4, 32)}, kquants))
for name, path in [("smollm2-head.gguf", "smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),
                   ("gemma3-head.gguf", "gemma3/gemma-3-270m-q4_k_m.gguf")]:
    if (root / "data" / path).exists():
        seed("gguf", name, (root / "data" / path).read_bytes()[:16384])


# --- safetensors --------------------------------------------------------------------------------------------------
def safetensors_file(tensors, metadata=None):
    header, data = {}, b""
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    if metadata:
        header["__metadata__"] = metadata
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + data


seed("safetensors", "ember.safetensors", safetensors_file(
    [("wte.weight", "F32", [2, 3], struct.pack("<6f", *range(6))), ("ln_f.gamma", "F32", [3], struct.pack("<3f", 1, 1, 1))],
    {"ember.train_state": json.dumps({"step": 3, "tokens": 96, "sampler": {"state": 7}})}))
seed("safetensors", "hf-mixed.safetensors", safetensors_file([
    ("h.0.attn.bias", "BOOL", [1, 1, 2, 2], bytes([1, 0, 1, 1])),
    ("wpe.weight", "F16", [2, 2], struct.pack("<4e", 0.5, -1, 2, 0)),
    ("wte.weight", "BF16", [2], struct.pack("<2H", 0x3F80, 0xC000)),
    ("lm_head.weight", "I32", [1], struct.pack("<i", 5)),
]))

# --- Hugging Face config.json and shard index ---------------------------------------------------------------------
seed("hf_config", "smollm2-config.json", json.dumps({
    "model_type": "llama", "hidden_size": 576, "num_attention_heads": 9, "num_key_value_heads": 3,
    "num_hidden_layers": 30, "intermediate_size": 1536, "vocab_size": 49152, "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-5, "rope_theta": 100000, "tie_word_embeddings": True, "head_dim": 64,
    "attention_bias": False, "mlp_bias": False, "rope_scaling": None}))
seed("hf_config", "gpt2-config.json", json.dumps({
    "model_type": "gpt2", "n_embd": 768, "n_head": 12, "n_layer": 12, "n_positions": 1024, "vocab_size": 50257,
    "layer_norm_epsilon": 1e-5, "activation_function": "gelu_new", "n_inner": None}))
seed("hf_config", "index.json", json.dumps({"metadata": {"total_size": 8}, "weight_map": {
    "a.weight": "model-00001-of-00002.safetensors", "b.weight": "model-00002-of-00002.safetensors"}}))

# --- run-directory config.toml -------------------------------------------------------------------------------------
for config in sorted((root / "configs").glob("*.toml")):
    seed("run_config", config.name, config.read_text())
seed("run_config", "run-dir.toml", """[model]
vocab_size = 65
n_layers = 2
n_heads = 2
d_model = 32
block_size = 32
positions = "rope"
norm = "rms_norm"
ffn = "swiglu"
n_kv_heads = 1
""")

# --- tokenizer.json: a character-level vocabulary, and a byte-level BPE -------------------------------------------
chars = sorted(set("\nabcdefghijklmnopqrstuvwxyz ,.:;!?'ABCDEFGHIJKLMNOPQRSTUVWXYZ"))
seed("tokenizer", "chars.json", json.dumps({
    "version": "1.0", "truncation": None, "padding": None, "added_tokens": [], "normalizer": None,
    "pre_tokenizer": {"type": "Split", "pattern": {"Regex": ""}, "behavior": "Isolated", "invert": False},
    "post_processor": None, "decoder": {"type": "Fuse"},
    "model": {"type": "WordLevel", "vocab": {c: i for i, c in enumerate(chars)}, "unk_token": "[UNK]"}}))
seed("tokenizer", "bpe.json", json.dumps({
    "version": "1.0", "truncation": None, "padding": None,
    "added_tokens": [{"id": 0, "content": "<|endoftext|>", "single_word": False, "lstrip": False, "rstrip": False,
                      "normalized": False, "special": True}],
    "normalizer": None,
    "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
    "post_processor": None, "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                                        "use_regex": True},
    "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
              "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
              "vocab": {"<|endoftext|>": 0, "T": 1, "o": 2, "To": 3, "Ġ": 4, "b": 5, "e": 6, "be": 7, "Ġbe": 8},
              "merges": [["T", "o"], ["b", "e"], ["Ġ", "be"]]}}))

# --- checkpoint training state -------------------------------------------------------------------------------------
seed("checkpoint_state", "lm.json", json.dumps({"step": 200, "tokens": 153600, "ranks": 1, "sampler": {"state": 42}}))
seed("checkpoint_state", "translation.json",
     json.dumps({"step": 12, "tokens": 4096, "epoch": 1, "position": 3, "rng": {"state": 9}, "epoch_rng": {"state": 1}}))

# --- parallel corpora ---------------------------------------------------------------------------------------------
seed("tsv", "pairs.tsv", "In the beginning\tEn el principio\nGod created\tDios creó\tlos cielos\n")
seed("tsv", "aligned.txt", "one\ntwo\nuno\ndos\n")

# --- completions bodies -------------------------------------------------------------------------
body = json.dumps({"model": "ember", "prompt": "To be", "max_tokens": 8, "temperature": 0.7, "top_p": 0.9,
                   "stop": ["\n"], "stream": True, "seed": 1})
seed("openai_request", "completion.json", body)
seed("openai_request", "minimal.json", json.dumps({"prompt": ["Hello"], "n": 1, "stop": None}))
seed("openai_request", "chat.json", json.dumps({"model": "ember", "messages": [
    {"role": "system", "content": "Be brief."}, {"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
    "max_completion_tokens": 8, "stream": True}))
seed("openai_request", "schema.json", json.dumps({"prompt": [[1, 2]], "echo": True, "max_tokens": 0, "response_format": {
    "type": "json_schema", "json_schema": {"name": "p", "schema": {"$defs": {"n": {"type": ["integer", "null"]}},
    "type": "object", "properties": {"a": {"$ref": "#/$defs/n"}, "b": {"type": "string", "maxLength": 3,
    "format": "date"}, "c": {"type": "array", "items": {"enum": ["x", 1]}}}, "required": ["a"]}}}}))
seed("openai_request", "regex.json", json.dumps({"prompt": "x", "structured_outputs": {"regex": "(ab|c){2,}[^\\n]?"}}))

# --- chat templates: SmolLM2's and the feature-rich ones of the transformers fixture ------------------------------
fixture = json.loads((root / "crates/formats/tests/fixtures/chat_templates.json").read_text())
for name, template in fixture["templates"].items():
    seed("chat_template", name.replace(" ", "-") + ".jinja", template)

# --- SentencePiece models: a hand-built one of three pieces, and the tiny Marian's target model (no normalizer) ----
def proto_field(number, wire, payload):
    key = bytes([number << 3 | wire])
    return key + (bytes([len(payload)]) + payload if wire == 2 else payload)


def proto_piece(text, score, kind):
    return proto_field(1, 2, text.encode()) + proto_field(2, 5, struct.pack("<f", score)) + proto_field(3, 0, bytes([kind]))


pieces = [("<unk>", 0.0, 2), ("\u2581a", -1.0, 1), ("b", -2.0, 1)]
normalizer = proto_field(3, 0, b"\x01") + proto_field(4, 0, b"\x01")
seed("sentencepiece", "three-pieces.model",
     b"".join(proto_field(1, 2, proto_piece(*p)) for p in pieces) + proto_field(2, 2, proto_field(3, 0, b"\x01"))
     + proto_field(3, 2, normalizer))
seed("sentencepiece", "marian-target.spm", (root / "crates/core-model/tests/fixtures/hf/marian-tiny/target.spm").read_bytes())

