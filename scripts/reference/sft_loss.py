#!/usr/bin/env python3
"""The supervised fine-tuning loss of TRL's SFTTrainer (assistant_only_loss=True) on one batch, for Ember's chat
training to equal: a tiny random Llama, a small byte-level BPE trained here, a ChatML template whose assistant turns
are marked with {% generation %} (so TRL masks them with transformers' return_assistant_tokens_mask), and four
conversations (system turns, two replies, unicode) in one batch padded as TRL pads it.

    python3 scripts/reference/sft_loss.py crates/train/tests/fixtures/sft-llama-tiny

Writes the model as a Hugging Face directory (config.json, model.safetensors, tokenizer.json, tokenizer_config.json,
chat_template.jinja), the conversations (chats.jsonl), and expected.json: TRL's loss, and each conversation's token ids
and assistant mask. Needs torch, transformers, trl and datasets.
"""
import json
import os
import sys

import torch
from datasets import Dataset
from tokenizers import Tokenizer, models, pre_tokenizers, decoders, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
from trl import SFTConfig, SFTTrainer

TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{% if message['role'] == 'assistant' %}{% generation %}{{ message['content'] + '<|im_end|>' }}{% endgeneration %}"
    "{% else %}{{ message['content'] + '<|im_end|>' }}{% endif %}{{ '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

CHATS = [
    [{"role": "user", "content": "What is the capital of France?"}, {"role": "assistant", "content": "Paris."}],
    [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "2 + 2?"},
     {"role": "assistant", "content": "4"}, {"role": "user", "content": "And 3 × 3?"},
     {"role": "assistant", "content": "9, of course."}],
    [{"role": "user", "content": "Say hello in French."}, {"role": "assistant", "content": "Bonjour — ça va ?"}],
    [{"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": "Blue."}],
]


def main(out):
    os.makedirs(out, exist_ok=True)
    text = [m["content"] for chat in CHATS for m in chat] * 4
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(text, trainers.BpeTrainer(
        vocab_size=320, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token="<|im_start|>", eos_token="<|im_end|>",
                                  pad_token="<|endoftext|>")
    tok.chat_template = TEMPLATE
    tok.save_pretrained(out)

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=128, rms_norm_eps=1e-6, tie_word_embeddings=True,
        initializer_range=0.2, pad_token_id=tok.pad_token_id, bos_token_id=None, eos_token_id=None))
    model.save_pretrained(out, safe_serialization=True)
    with open(os.path.join(out, "chats.jsonl"), "w", encoding="utf-8") as f:
        for chat in CHATS:
            f.write(json.dumps({"messages": chat}, ensure_ascii=False) + "\n")

    args = SFTConfig(output_dir=os.path.join(out, ".trl"), assistant_only_loss=True, per_device_train_batch_size=4,
                     report_to=[], max_length=None, padding_free=False, packing=False, use_cpu=True)
    trainer = SFTTrainer(model=model, args=args, processing_class=tok, train_dataset=Dataset.from_list(
        [{"messages": chat} for chat in CHATS]))
    rows = [trainer.train_dataset[i] for i in range(len(CHATS))]
    batch = trainer.data_collator(rows)
    model.eval()
    with torch.no_grad():
        loss = trainer.compute_loss(model, batch).item()
    expected = {
        "trl_loss": loss,
        "examples": [{"input_ids": r["input_ids"], "assistant_masks": r["assistant_masks"]} for r in rows],
    }
    with open(os.path.join(out, "expected.json"), "w") as f:
        json.dump(expected, f)
        f.write("\n")
    for name in os.listdir(out):
        if name not in {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                        "chat_template.jinja", "chats.jsonl", "expected.json"}:
            path = os.path.join(out, name)
            if os.path.isdir(path):
                import shutil
                shutil.rmtree(path)
            else:
                os.remove(path)
    print(f"TRL loss {loss:.6f} over {len(CHATS)} conversations, written to {out}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
