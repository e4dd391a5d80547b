"""Conformance fixture for Ember's encoder-decoder model: PyTorch's torch.nn.Transformer (Post-LN, ReLU, no final
stack norms, as in the 2017 paper) wrapped with shared embeddings scaled by sqrt(d), sinusoidal positions and an
output projection tied to the embedding. Weights are random (LayerNorm gains and biases too), exported under
Ember's parameter names (Linear weights transposed to [in, out]); logits for a padded batch go to a JSON file.

Usage: python scripts/reference/seq2seq_fixture.py crates/core-model/tests/fixtures/seq2seq
"""
import json
import math
import sys

import torch
from safetensors.torch import save_file
from torch import nn

out_dir = sys.argv[1]
torch.manual_seed(0)
V, D, H, FF, L = 23, 32, 4, 64, 2

layer = lambda: nn.TransformerEncoderLayer(D, H, FF, dropout=0.0, batch_first=True)
encoder = nn.TransformerEncoder(layer(), L, norm=None, enable_nested_tensor=False)
decoder = nn.TransformerDecoder(nn.TransformerDecoderLayer(D, H, FF, dropout=0.0, batch_first=True), L, norm=None)
model = nn.Transformer(D, H, L, L, FF, dropout=0.0, batch_first=True, custom_encoder=encoder, custom_decoder=decoder)
emb = nn.Embedding(V, D)
nn.init.normal_(emb.weight, std=D ** -0.5)
with torch.no_grad():
    for name, p in model.named_parameters():
        if "norm" in name:
            p.copy_(torch.randn_like(p) * 0.2 + (1.0 if name.endswith("weight") else 0.0))
        elif name.endswith("bias"):
            p.copy_(torch.randn_like(p) * 0.1)
model.eval()


def positions(t):
    pos = torch.arange(t, dtype=torch.float64)[:, None]
    div = torch.exp(torch.arange(0, D, 2, dtype=torch.float64) * (-math.log(10000.0) / D))
    pe = torch.zeros(t, D, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(pos * div)
    pe[:, 1::2] = torch.cos(pos * div)
    return pe.float()


src = torch.tensor([[5, 9, 2, 17, 3, 11, 8], [4, 12, 6, 1, 0, 0, 0]])
src_lengths = [7, 4]
tgt = torch.tensor([[1, 7, 7, 20, 14], [1, 3, 22, 9, 0]])
pad = torch.arange(src.shape[1])[None, :] >= torch.tensor(src_lengths)[:, None]
with torch.no_grad():
    x = emb(src) * math.sqrt(D) + positions(src.shape[1])
    y = emb(tgt) * math.sqrt(D) + positions(tgt.shape[1])
    causal = nn.Transformer.generate_square_subsequent_mask(tgt.shape[1])
    h = model(x, y, tgt_mask=causal, src_key_padding_mask=pad, memory_key_padding_mask=pad, tgt_is_causal=True)
    logits = h @ emb.weight.T

t = lambda w: w.detach().t().contiguous()
c = lambda w: w.detach().contiguous()
tensors = {"src_emb.weight": c(emb.weight)}
for i, l in enumerate(model.encoder.layers):
    p = f"encoder.{i}."
    tensors |= {
        p + "self_attn.c_attn.weight": t(l.self_attn.in_proj_weight), p + "self_attn.c_attn.bias": c(l.self_attn.in_proj_bias),
        p + "self_attn.c_proj.weight": t(l.self_attn.out_proj.weight), p + "self_attn.c_proj.bias": c(l.self_attn.out_proj.bias),
        p + "ln_1.gamma": c(l.norm1.weight), p + "ln_1.beta": c(l.norm1.bias),
        p + "ln_2.gamma": c(l.norm2.weight), p + "ln_2.beta": c(l.norm2.bias),
        p + "mlp.c_fc.weight": t(l.linear1.weight), p + "mlp.c_fc.bias": c(l.linear1.bias),
        p + "mlp.c_proj.weight": t(l.linear2.weight), p + "mlp.c_proj.bias": c(l.linear2.bias),
    }
for i, l in enumerate(model.decoder.layers):
    p = f"decoder.{i}."
    w, b = l.multihead_attn.in_proj_weight, l.multihead_attn.in_proj_bias
    tensors |= {
        p + "self_attn.c_attn.weight": t(l.self_attn.in_proj_weight), p + "self_attn.c_attn.bias": c(l.self_attn.in_proj_bias),
        p + "self_attn.c_proj.weight": t(l.self_attn.out_proj.weight), p + "self_attn.c_proj.bias": c(l.self_attn.out_proj.bias),
        p + "cross.q_proj.weight": t(w[:D]), p + "cross.q_proj.bias": c(b[:D]),
        p + "cross.kv_proj.weight": t(w[D:]), p + "cross.kv_proj.bias": c(b[D:]),
        p + "cross.c_proj.weight": t(l.multihead_attn.out_proj.weight), p + "cross.c_proj.bias": c(l.multihead_attn.out_proj.bias),
        p + "ln_1.gamma": c(l.norm1.weight), p + "ln_1.beta": c(l.norm1.bias),
        p + "ln_2.gamma": c(l.norm2.weight), p + "ln_2.beta": c(l.norm2.bias),
        p + "ln_3.gamma": c(l.norm3.weight), p + "ln_3.beta": c(l.norm3.bias),
        p + "mlp.c_fc.weight": t(l.linear1.weight), p + "mlp.c_fc.bias": c(l.linear1.bias),
        p + "mlp.c_proj.weight": t(l.linear2.weight), p + "mlp.c_proj.bias": c(l.linear2.bias),
    }
save_file(tensors, f"{out_dir}/model.safetensors")
json.dump({"torch": torch.__version__, "vocab": V, "d_model": D, "n_heads": H, "d_ff": FF, "layers": L,
           "src": src.tolist(), "src_lengths": src_lengths, "tgt": tgt.tolist(),
           "logits": [[[round(v, 7) for v in row] for row in seq] for seq in logits.tolist()]},
          open(f"{out_dir}/logits.json", "w"))
print(f"wrote {len(tensors)} tensors; logits {tuple(logits.shape)}")
