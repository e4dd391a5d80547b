"""GGUF files of the tiny Qwen2, Qwen3, Phi-3 (plain and LongRoPE), Gemma 2 and 3, DeepSeek-V2 (plain and YaRN) and RoPE-scaled (linear, YaRN, Llama 3) Llama
fixtures, written by llama.cpp's own convert_hf_to_gguf.py (which writes no GGUF form of dynamic NTK scaling).

Each model directory of scripts/reference/hf_fixtures.py (random weights, transformers' logits in
expected.safetensors) is copied with a small SentencePiece tokenizer trained here (the converter needs one; the
model's 96 rows are padded past its vocabulary by the converter) and converted to f32, so Ember's GGUF importer is
checked against the same logits as its Hugging Face importer.

usage: gguf_fixtures.py LLAMA_CPP_DIR FIXTURES_DIR
  LLAMA_CPP_DIR: llama.cpp's source, e.g. vendor/llama.cpp of the PyPI llama-cpp-python sdist (docs/benchmarks.md)
  FIXTURES_DIR:  crates/core-model/tests/fixtures/hf (reads NAME/, writes NAME.gguf)
Needs torch, transformers, sentencepiece, numpy and llama.cpp's gguf-py (on the path from LLAMA_CPP_DIR).
"""
import os
import shutil
import subprocess
import sys
import tempfile

import sentencepiece as spm

FAMILIES = ["qwen2-tiny", "qwen3-tiny", "phi3-tiny", "gemma2-tiny", "gemma3-tiny", "deepseek2-tiny",
            "deepseek2-yarn-tiny", "linear-rope-tiny", "yarn-rope-tiny", "llama3-rope-tiny", "longrope-tiny"]
# DeepSeek's converter reads only byte-level BPE tokenizers whose pre-tokenizer hash it knows; these fixtures carry the
# same small SentencePiece tokenizer as the others, so its set_vocab is pointed at the SentencePiece reader. Every
# tensor and metadata key is still written by the converter's own DeepseekV2Model.
SENTENCEPIECE_VOCAB = '''
import runpy, sys
import conversion.deepseek
conversion.deepseek.DeepseekV2Model.set_vocab = lambda self: self._set_vocab_sentencepiece()
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
'''
TEXT = [
    "The capital of France is Paris, and the capital of Spain is Madrid.",
    "Once upon a time, a small model learned to read its own weights.",
    "def fibonacci(n): return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)",
    "Every tensor has a name, a shape and a type; the file keeps them in order.",
]


def main(llama_cpp, fixtures):
    convert = os.path.join(llama_cpp, "convert_hf_to_gguf.py")
    env = dict(os.environ, PYTHONPATH=os.path.join(llama_cpp, "gguf-py"), NO_LOCAL_GGUF="")
    for name in FAMILIES:
        with tempfile.TemporaryDirectory() as tmp:
            for file in ("config.json", "model.safetensors"):
                shutil.copy(os.path.join(fixtures, name, file), tmp)
            spm.SentencePieceTrainer.train(sentence_iterator=iter(TEXT), model_prefix=os.path.join(tmp, "tokenizer"),
                                           vocab_size=64, model_type="bpe", character_coverage=1.0, unk_id=0,
                                           bos_id=1, eos_id=2, pad_id=-1, minloglevel=2)
            out = os.path.join(fixtures, name + ".gguf")
            command = [convert, tmp, "--outtype", "f32", "--outfile", out]
            if name.startswith("deepseek2"):
                command = ["-c", SENTENCEPIECE_VOCAB] + command
            subprocess.run([sys.executable] + command, check=True, env={**env, "PYTHONPATH": env["PYTHONPATH"] + os.pathsep + llama_cpp})
            print(out, os.path.getsize(out), "bytes")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
