//! The decoder-only GPT (nanoGPT / GPT-2): token + learned position embeddings, Pre-LN blocks, final LayerNorm,
//! output projection tied to the token embedding.

use burn::module::Module;
use burn::nn::{Dropout, DropoutConfig, Embedding, LayerNorm, LayerNormConfig};
use burn::tensor::{Device, Int, Tensor};

use crate::init;
use crate::nn::attention::CausalSelfAttention;
use crate::nn::mlp::Mlp;
use crate::{ModelConfig, Rng};

#[derive(Module, Debug)]
pub struct Block {
    pub ln_1: LayerNorm,
    pub attn: CausalSelfAttention,
    pub ln_2: LayerNorm,
    pub mlp: Mlp,
}

impl Block {
    fn new(config: &ModelConfig, rng: &mut Rng, device: &Device) -> Self {
        let ln = || LayerNormConfig::new(config.d_model).with_bias(config.bias).init(device);
        Self {
            ln_1: ln(),
            attn: CausalSelfAttention::new(config, rng, device),
            ln_2: ln(),
            mlp: Mlp::new(config, rng, device),
        }
    }

    /// Pre-LN: x + Attn(LN(x)), then x + FFN(LN(x)).
    fn forward(&self, x: Tensor<3>) -> Tensor<3> {
        let x = x.clone() + self.attn.forward(self.ln_1.forward(x));
        x.clone() + self.mlp.forward(self.ln_2.forward(x))
    }
}

#[derive(Module, Debug)]
pub struct Gpt {
    pub wte: Embedding,
    pub wpe: Embedding,
    drop: Dropout,
    pub blocks: Vec<Block>,
    pub ln_f: LayerNorm,
}

impl Gpt {
    /// GPT-2 initialisation from `rng`: embeddings N(0, 0.02), norms γ = 1, β = 0.
    pub fn new(config: &ModelConfig, rng: &mut Rng, device: &Device) -> Self {
        let wte = Embedding { weight: init::normal(rng, [config.vocab(), config.d_model], 0.02, device) };
        let wpe = Embedding { weight: init::normal(rng, [config.block_size, config.d_model], 0.02, device) };
        let blocks = (0..config.n_layers).map(|_| Block::new(config, rng, device)).collect();
        Self {
            wte,
            wpe,
            drop: DropoutConfig::new(config.dropout).init(),
            blocks,
            ln_f: LayerNormConfig::new(config.d_model).with_bias(config.bias).init(device),
        }
    }

    /// Logits [B, T, V] for token ids [B, T] (T ≤ block_size): LN_f(blocks(E[x] + P[0..T])) Eᵀ.
    pub fn forward(&self, idx: Tensor<2, Int>) -> Tensor<3> {
        let [_, t] = idx.dims();
        let pos = Tensor::<1, Int>::arange(0..t as i64, &idx.device()).reshape([1, t]);
        let mut x = self.drop.forward(self.wte.forward(idx) + self.wpe.forward(pos));
        for block in &self.blocks {
            x = block.forward(x);
        }
        let x = self.ln_f.forward(x);
        burn::tensor::module::linear(x, self.wte.weight.val().transpose(), None)
    }

    /// The context length the position table allows.
    pub fn block_size(&self) -> usize {
        self.wpe.weight.dims()[0]
    }

    /// Whether the parameter at `path` is an embedding table (weight decay on these is configurable).
    pub fn is_embedding(path: &str) -> bool {
        path.starts_with("wte.") || path.starts_with("wpe.")
    }
}
