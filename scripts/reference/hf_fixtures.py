#!/usr/bin/env python3
"""Conformance fixtures from Hugging Face transformers, for Ember's importers.

- gpt2-tiny/ and llama-tiny/: small random-init GPT2LMHeadModel and LlamaForCausalLM (GQA: 4 query / 2 KV heads,
  rope_theta 1000, untied output), built offline from config objects and saved with save_pretrained
  (config.json + model.safetensors), plus expected.safetensors: fixed input ids (as f32) and their logits.
- qwen2-tiny/, qwen3-tiny/, mistral-tiny/: the same for Qwen2ForCausalLM (q, k, v biases, tied output),
  Qwen3ForCausalLM (RMSNorm of each head's q and k, head_dim 16 with hidden 32) and MistralForCausalLM (a sliding
  window of 5 keys, shorter than the 12-token input); phi3-tiny/: Phi3ForCausalLM (q, k, v in one qkv_proj, gate and
  up in one gate_up_proj, a sliding window of 5).
- llama3-rope-tiny/, linear-rope-tiny/, yarn-rope-tiny/, dynamic-rope-tiny/: LlamaForCausalLM with Llama 3.1's
  RoPE scaling (factor 4, original context 32, so that the head's four frequencies fall in each of its three bands),
  with linear scaling (factor 4), with YaRN (factor 4, original context 32: one pair kept, three interpolated; cos
  and sin scaled) and with dynamic NTK scaling (factor 4 past max_position_embeddings = 32); longrope-tiny/:
  Phi3ForCausalLM with LongRoPE (short and long factors per pair, original context 32 of 128).
- gemma2-tiny/: Gemma2ForCausalLM (sandwich norms, GeGLU, √d embeddings, a window of 5 on layer 0 and none on
  layer 1, scores soft-capped at 2 and logits at 3, head_dim 16 with hidden 32); gemma2-scalar-tiny/: the same with
  query_pre_attn_scalar 24 instead of the head width (Hugging Face only: llama.cpp's GGUF does not store it).
- gemma3-tiny/: Gemma3ForCausalLM (its text model: Gemma 2's layout with per-head q/k RMSNorm; six layers, the sixth
  global with RoPE base 1000 and linear scaling 4, the others windowed with base 10,000 unscaled).
- deepseek2-tiny/: DeepseekV2ForCausalLM with dense layers (multi-head latent attention: a latent of 16, RMSNorm'd;
  content heads of 8 and a shared RoPE key of 8 in DeepSeek's interleaved pairs; queries through a rank-24
  bottleneck); deepseek2-yarn-tiny/: the same with YaRN (factor 4 over 32 positions, mscale = mscale_all_dim 0.707).
- Every family's input is 64 tokens long (twice the RoPE-scaled models' original context), and each stores
  greedy_ids: 8 prompt tokens and the 32 that transformers adds greedily (with its KV cache, so that
  dynamic and LongRoPE scalings change their frequencies as the sequence grows, as in cached decoding).
- smollm2_greedy.json: Hugging Face's greedy continuation (16 tokens, f32 weights dequantized from the same GGUF by
  transformers) of three prompts with SmolLM2-135M-Instruct, and the prompt token ids.

    python3 scripts/reference/hf_fixtures.py crates/core-model/tests/fixtures/hf data/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
    python3 scripts/reference/hf_fixtures.py --families crates/core-model/tests/fixtures/hf [NAME ...]  (only these)

Needs torch, transformers, safetensors and gguf (pip install torch transformers safetensors gguf).
"""
import json
import os
import sys

import torch
from safetensors.torch import save_file
from transformers import (AutoModelForCausalLM, AutoTokenizer, DeepseekV2Config, DeepseekV2ForCausalLM,
                          Gemma2Config, Gemma2ForCausalLM, Gemma3ForCausalLM, Gemma3TextConfig, GPT2Config,
                          GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM,
                          Qwen2Config, Qwen2ForCausalLM, Phi3Config, Phi3ForCausalLM, Qwen3Config, Qwen3ForCausalLM)

PROMPTS = ["The capital of France is", "Once upon a time,", "def fibonacci(n):"]


def save_tiny(model, out, vocab, length=12, greedy=0):
    torch.manual_seed(1)
    ids = torch.randint(0, vocab, (2, length))
    with torch.no_grad():
        logits = model(ids).logits
        # Greedy continuation of the first row's first 8 tokens, decoded with the KV cache (no stop token).
        seq = ids[:1, :8]
        step = model(seq, use_cache=True)
        for _ in range(greedy):
            token = step.logits[:, -1].argmax(-1, keepdim=True)
            seq = torch.cat([seq, token], dim=1)
            step = model(token, past_key_values=step.past_key_values, use_cache=True)
    os.makedirs(out, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    for extra in ("generation_config.json",):
        if os.path.exists(os.path.join(out, extra)):
            os.remove(os.path.join(out, extra))
    expected = {"input_ids": ids.to(torch.float32), "logits": logits.contiguous()}
    if greedy:
        expected["greedy_ids"] = seq[0].to(torch.float32).contiguous()
    save_file(expected, os.path.join(out, "expected.safetensors"))
    print(out, "logits", tuple(logits.shape), "max |logit|", float(logits.abs().max()))


def gguf_model(gguf_path):
    """The tokenizer and the f32 model transformers makes of a GGUF file (its weights dequantized)."""
    folder, name = os.path.split(os.path.abspath(gguf_path))
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    return tok, AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32).eval()


def main(out_dir, gguf_path):
    torch.manual_seed(0)
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=96, n_positions=32, n_embd=32, n_layer=2, n_head=4,
                                      initializer_range=0.2)).eval()
    save_tiny(gpt2, os.path.join(out_dir, "gpt2-tiny"), 96)

    torch.manual_seed(0)
    llama = LlamaForCausalLM(LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                         rope_theta=1000.0, rms_norm_eps=1e-6, tie_word_embeddings=False,
                                         initializer_range=0.2)).eval()
    save_tiny(llama, os.path.join(out_dir, "llama-tiny"), 96)
    families(out_dir)

    tok, model = gguf_model(gguf_path)
    records = []
    for prompt in PROMPTS:
        ids = tok(prompt, return_tensors="pt").input_ids
        with torch.no_grad():
            out = model.generate(ids, do_sample=False, max_new_tokens=16, attention_mask=torch.ones_like(ids))
        new = out[0, ids.shape[1]:].tolist()
        records.append({"prompt": prompt, "prompt_ids": ids[0].tolist(), "greedy_ids": new,
                        "greedy_text": tok.decode(new)})
        print(json.dumps(records[-1]))
    with open(os.path.join(out_dir, "smollm2_greedy.json"), "w") as f:
        json.dump({"model": "SmolLM2-135M-Instruct.Q4_1.gguf dequantized to f32", "max_new_tokens": 16,
                   "records": records}, f, indent=1)


def families(out_dir):
    shape = dict(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-6, initializer_range=0.2,
                 rope_parameters={"rope_type": "default", "rope_theta": 1000.0})
    gemma2_shape = {**shape, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}
    deepseek_shape = {**shape, "num_key_value_heads": 4, "q_lora_rank": 24, "kv_lora_rank": 16,
                      "qk_nope_head_dim": 8, "qk_rope_head_dim": 8, "v_head_dim": 8, "first_k_dense_replace": 2,
                      "n_routed_experts": 4, "moe_intermediate_size": 16, "tie_word_embeddings": False}
    only = sys.argv[3:]
    for name, cls, config in [
        ("qwen2-tiny", Qwen2ForCausalLM, Qwen2Config(**shape, tie_word_embeddings=True)),
        ("qwen3-tiny", Qwen3ForCausalLM, Qwen3Config(**shape, head_dim=16, tie_word_embeddings=False)),
        ("mistral-tiny", MistralForCausalLM, MistralConfig(**shape, sliding_window=5, tie_word_embeddings=False)),
        # Its own copy of rope_parameters: Phi3Config adds partial_rotary_factor to the dict it is given.
        ("phi3-tiny", Phi3ForCausalLM, Phi3Config(**{**shape, "rope_parameters": dict(shape["rope_parameters"])},
                                                  sliding_window=5, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                                                  tie_word_embeddings=False)),
        ("llama3-rope-tiny", LlamaForCausalLM, LlamaConfig(**{**shape, "rope_parameters": {
            "rope_type": "llama3", "rope_theta": 1000.0, "factor": 4.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 32}}, tie_word_embeddings=False)),
        ("linear-rope-tiny", LlamaForCausalLM, LlamaConfig(**{**shape, "rope_parameters": {
            "rope_type": "linear", "rope_theta": 1000.0, "factor": 4.0}}, tie_word_embeddings=False)),
        ("yarn-rope-tiny", LlamaForCausalLM, LlamaConfig(**{**shape, "rope_parameters": {
            "rope_type": "yarn", "rope_theta": 1000.0, "factor": 4.0, "original_max_position_embeddings": 32}},
            tie_word_embeddings=False)),
        ("dynamic-rope-tiny", LlamaForCausalLM, LlamaConfig(**{**shape, "max_position_embeddings": 32,
            "rope_parameters": {"rope_type": "dynamic", "rope_theta": 1000.0, "factor": 4.0}},
            tie_word_embeddings=False)),
        ("longrope-tiny", Phi3ForCausalLM, Phi3Config(**{**shape, "max_position_embeddings": 128,
            "rope_parameters": {"rope_type": "longrope", "rope_theta": 1000.0, "short_factor": [1.0, 1.25, 1.5, 2.0],
                                "long_factor": [1.0, 3.0, 6.0, 12.0], "original_max_position_embeddings": 32}},
            original_max_position_embeddings=32, pad_token_id=0, bos_token_id=1, eos_token_id=2,
            tie_word_embeddings=False)),
        # Caps low enough that tanh bends these random models' scores and logits; RoPE base 10,000, which llama.cpp's
        # converter assumes for Gemma 2 (it writes no rope.freq_base).
        ("gemma2-tiny", Gemma2ForCausalLM, Gemma2Config(**gemma2_shape, head_dim=16, query_pre_attn_scalar=16,
                                                        sliding_window=5, attn_logit_softcapping=2.0,
                                                        final_logit_softcapping=3.0)),
        ("gemma2-scalar-tiny", Gemma2ForCausalLM, Gemma2Config(**gemma2_shape, head_dim=16, query_pre_attn_scalar=24,
                                                               sliding_window=5, attn_logit_softcapping=2.0,
                                                               final_logit_softcapping=3.0)),
        # Six layers, the sixth global: RoPE base 1000 stretched 4 times (linear) there, 10,000 unstretched on the others.
        ("gemma3-tiny", Gemma3ForCausalLM, Gemma3TextConfig(**{**shape, "num_hidden_layers": 6, "rope_parameters": {
            "full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}}, head_dim=16,
            query_pre_attn_scalar=16, sliding_window=5)),
        # Dense layers only (first_k_dense_replace = every layer), queries through a rank-24 bottleneck; the second
        # with DeepSeek-V2's YaRN (mscale = mscale_all_dim, so cos and sin stay unscaled and the scores take mscale²).
        ("deepseek2-tiny", DeepseekV2ForCausalLM, DeepseekV2Config(**deepseek_shape)),
        ("deepseek2-yarn-tiny", DeepseekV2ForCausalLM, DeepseekV2Config(**{**deepseek_shape, "rope_parameters": {
            "rope_type": "yarn", "rope_theta": 1000.0, "factor": 4.0, "original_max_position_embeddings": 32,
            "mscale": 0.707, "mscale_all_dim": 0.707, "beta_fast": 32.0, "beta_slow": 1.0}})),
    ]:
        if only and name not in only:
            continue
        torch.manual_seed(0)
        model = cls(config).eval()
        # Random biases and norm gains, so that a missing or misplaced one shows in the logits.
        with torch.no_grad():
            for key, tensor in model.named_parameters():
                if key.endswith(("bias", "norm.weight")):
                    tensor.normal_(1.0 if key.endswith("norm.weight") else 0.0, 0.3)
        if name in ("mistral-tiny", "phi3-tiny"):
            model.config._attn_implementation = "eager"
        save_tiny(model, os.path.join(out_dir, name), 96, 64, greedy=32)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--families"]:
        families(sys.argv[2])
    else:
        main(sys.argv[1], sys.argv[2])
