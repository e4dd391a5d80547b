#!/usr/bin/env python3
"""A tiny random MarianMTModel (the OPUS-MT architecture) from transformers, for Ember's Marian importer.

Post-LN encoder and decoder of 2 layers each, width 32, 4 heads, SiLU ("swish") feed-forward of 64, embeddings scaled
by √d and shared by encoder, decoder and output, Marian's sinusoidal positions (sines in the first half of each
vector, cosines in the second), a random final_logits_bias and random LayerNorm gains and biases, then 300 Adam steps on ten sentence pairs. Saved with
save_pretrained (config.json + model.safetensors) beside expected.safetensors: two source rows (the second padded),
teacher-forced decoder inputs starting with the decoder start token (the pad id, as Marian's), and their logits; 20
sources and what generate() makes of each (after the start token, padded with the pad id), once with the canonical
search (num_beams=4, length_penalty 0, early_stopping True, nothing banned or forced) and once with the directory's
defaults. generation_config.json is an OPUS-MT model's: 4 beams, the pad banned (bad_words_ids), </s> forced at
the last position, max_length of the positions, transformers' length_penalty 1 and early_stopping False. The
vocabulary is OPUS-MT's layout: unigram SentencePiece models trained here on ten English–Spanish pairs (source.spm,
target.spm) and one vocab.json over both; translations.json holds 20 English sentences, the ids MarianTokenizer gives
them and the text generate() translates them to with the directory's defaults.

    python3 scripts/reference/marian_fixture.py crates/core-model/tests/fixtures/hf/marian-tiny
    python3 scripts/reference/marian_fixture.py crates/core-model/tests/fixtures/hf/marian-separate-tiny --separate
    (separate source and target vocabularies and embeddings: share_encoder_decoder_embeddings false)

Needs torch, transformers, sentencepiece and safetensors.
"""
import json
import os
import sys
import tempfile

import sentencepiece as spm
import torch
from safetensors.torch import save_file
from transformers import GenerationConfig, MarianConfig, MarianMTModel, MarianTokenizer

PAIRS = [
    ("the cat sits on the mat", "el gato se sienta en la alfombra"),
    ("the dog runs in the park", "el perro corre en el parque"),
    ("a small model reads its weights", "un modelo pequeño lee sus pesos"),
    ("we translate every sentence", "traducimos cada frase"),
    ("the house is red and the door is blue", "la casa es roja y la puerta es azul"),
    ("she writes a letter to her friend", "ella escribe una carta a su amiga"),
    ("they eat bread and cheese at noon", "ellos comen pan y queso al mediodía"),
    ("the train leaves at nine", "el tren sale a las nueve"),
    ("my brother plays the guitar", "mi hermano toca la guitarra"),
    ("the river flows to the sea", "el río fluye hacia el mar"),
]


def sentencepiece(lines, prefix, normalization, size):
    """A small unigram SentencePiece model of `lines` (`size` pieces) with the named normalization rules."""
    spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_prefix=prefix, vocab_size=size,
                                   model_type="unigram", character_coverage=1.0, hard_vocab_limit=False,
                                   normalization_rule_name=normalization, unk_id=0, bos_id=-1, eos_id=1, pad_id=-1,
                                   minloglevel=2)
    return prefix + ".model"


def vocabulary(out, separate):
    """Source and target SentencePiece models (the source with OPUS-MT's nmt_nfkc rules, a compiled character map;
    the target with none) and the vocabulary: one vocab.json over both as OPUS-MT lays it out (</s> 0, <unk> 1, the
    source's pieces, the target's new ones, <pad> last), or with `separate` vocab.json for the source and
    target_vocab.json for the target, each </s> 0, <unk> 1, <pad> 2, then its side's pieces."""
    with tempfile.TemporaryDirectory() as tmp:
        for side, lines, rules, size in (("source", [p[0] for p in PAIRS], "nmt_nfkc", 60),
                                         ("target", [p[1] for p in PAIRS], "identity", 50)):
            with open(sentencepiece(lines * 4, os.path.join(tmp, side), rules, size), "rb") as f, \
                    open(os.path.join(out, side + ".spm"), "wb") as g:
                g.write(f.read())
    pieces = {}
    for side in ("source", "target"):
        model = spm.SentencePieceProcessor(model_file=os.path.join(out, side + ".spm"))
        pieces[side] = [model.id_to_piece(i) for i in range(model.get_piece_size())
                        if not (model.is_control(i) or model.is_unknown(i))]
    if separate:
        tables = {}
        for side, name in (("source", "vocab.json"), ("target", "target_vocab.json")):
            tables[side] = {"</s>": 0, "<unk>": 1, "<pad>": 2}
            for piece in pieces[side]:
                tables[side].setdefault(piece, len(tables[side]))
            with open(os.path.join(out, name), "w") as f:
                json.dump(tables[side], f, ensure_ascii=False, indent=1)
        return tables["source"], tables["target"]
    vocab = {"</s>": 0, "<unk>": 1}
    for piece in pieces["source"] + pieces["target"]:
        vocab.setdefault(piece, len(vocab))
    vocab["<pad>"] = len(vocab)
    with open(os.path.join(out, "vocab.json"), "w") as f:
        json.dump(vocab, f, ensure_ascii=False, indent=1)
    return vocab, vocab


def main(out, separate):
    os.makedirs(out, exist_ok=True)
    source_vocab, target_vocab = vocabulary(out, separate)
    v, tv, pad = len(source_vocab), len(target_vocab), target_vocab["<pad>"]
    config = MarianConfig(vocab_size=v, decoder_vocab_size=tv, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                          decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64,
                          max_position_embeddings=64, pad_token_id=pad, eos_token_id=0, decoder_start_token_id=pad,
                          forced_eos_token_id=None, activation_function="swish", scale_embedding=True,
                          share_encoder_decoder_embeddings=not separate, init_std=0.2)
    torch.manual_seed(0)
    model = MarianMTModel(config)
    with torch.no_grad():
        for key, tensor in model.named_parameters():
            if "layer_norm" in key:
                tensor.normal_(1.0 if key.endswith("weight") else 0.0, 0.3)
        model.final_logits_bias.normal_(0.0, 0.5)
    # A few hundred steps on the ten pairs, so that the translations are words and end in </s> of their own accord.
    tokenizer = MarianTokenizer(os.path.join(out, "source.spm"), os.path.join(out, "target.spm"),
                                os.path.join(out, "vocab.json"), separate_vocabs=separate,
                                target_vocab_file=os.path.join(out, "target_vocab.json") if separate else None)
    batch = tokenizer([p[0] for p in PAIRS], text_target=[p[1] for p in PAIRS], padding=True, return_tensors="pt")
    batch["labels"][batch["labels"] == pad] = -100
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(300):
        optimizer.zero_grad()
        model(**batch).loss.backward()
        optimizer.step()
    model.eval()
    torch.manual_seed(1)
    # Ids of pieces only (3 up to the last piece: past </s>, <unk> and, separate, <pad>; short of a last <pad>).
    src = torch.randint(3, v - 1, (2, 12))
    src[1, 9:] = pad
    mask = (src != pad).long()
    tgt = torch.cat([torch.full((2, 1), pad), torch.randint(3, tv - 1, (2, 9))], dim=1)
    with torch.no_grad():
        logits = model(input_ids=src, attention_mask=mask, decoder_input_ids=tgt).logits
    model.generation_config = GenerationConfig(
        bad_words_ids=[[pad]], bos_token_id=0, decoder_start_token_id=pad, eos_token_id=0, forced_eos_token_id=0,
        max_length=config.max_position_embeddings, num_beams=4, pad_token_id=pad)
    model.save_pretrained(out, safe_serialization=True)
    # Beam search: 20 sources of 3 to 12 tokens, each decoded alone with up to its length + 4 new tokens: the
    # canonical search (no length normalisation, a sentence done once 4 hypotheses end in </s>) and the defaults.
    torch.manual_seed(2)
    beam_src = torch.full((20, 12), pad)
    beam_out = torch.full((20, 17), pad)
    beam_default = torch.full((20, 17), pad)
    lengths = torch.randint(3, 13, (20,))
    for i, n in enumerate(lengths.tolist()):
        beam_src[i, :n] = torch.randint(3, v - 1, (n,))
        with torch.no_grad():
            y = model.generate(beam_src[i:i + 1, :n], num_beams=4, length_penalty=0.0, early_stopping=True,
                               bad_words_ids=None, forced_eos_token_id=None, max_new_tokens=n + 4,
                               do_sample=False)[0, 1:]
            beam_out[i, :len(y)] = y
            y = model.generate(beam_src[i:i + 1, :n], max_new_tokens=n + 4)[0, 1:]
            beam_default[i, :len(y)] = y
    f32 = lambda t: t.to(torch.float32).contiguous()
    save_file({"src": f32(src), "src_lengths": f32(mask.sum(1)), "tgt": f32(tgt), "logits": logits.contiguous(),
               "beam_src": f32(beam_src), "beam_lengths": f32(lengths), "beam_out": f32(beam_out),
               "beam_default": f32(beam_default)},
              os.path.join(out, "expected.safetensors"))
    # Text in, text out: MarianTokenizer (the SentencePiece models and vocab.json above) and generate() with the
    # directory's defaults.
    sources = [p[0] for p in PAIRS] + [p[0].replace("the ", "a ", 1) + " again" for p in PAIRS]
    translations = []
    for text in sources:
        ids = tokenizer(text, return_tensors="pt").input_ids
        with torch.no_grad():
            y = model.generate(ids)
        translations.append({"source": text, "ids": ids[0].tolist(),
                             "translation": tokenizer.decode(y[0], skip_special_tokens=True)})
    with open(os.path.join(out, "translations.json"), "w") as f:
        json.dump(translations, f, ensure_ascii=False, indent=1)
    print(out, "logits", tuple(logits.shape), "max |logit|", float(logits.abs().max()), "vocabulary", v)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:] == ["--separate"])
