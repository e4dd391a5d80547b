//! The decoder-only language model. GPT-2 (learned positions, Pre-LN LayerNorm, GELU, tied output) and Llama
//! (RoPE, RMSNorm, GQA, SwiGLU, untied output) are configs of this one model; see [`ModelConfig`].

use burn::module::Module;
use burn::nn::{Dropout, DropoutConfig, Embedding, Linear};
use burn::tensor::{Device, Int, Tensor, TensorData};
use ember_kernels::{AttentionSpec, linear};

use crate::cache::KvCache;
use crate::config::{AttentionKind, NormPlacement, PositionKind};
use crate::nn::attention::CausalSelfAttention;
use crate::nn::ffn::Ffn;
use crate::nn::mla::{MlaAttention, MlaProjections};
use crate::nn::norm::Norm;
use crate::nn::position::{Rope, sinusoidal};
use crate::nn::residual::sublayer;
use crate::nn::{linear_layer, tied_logits};
use crate::{ModelConfig, Rng, init};

/// Self-attention of one block: MHA / GQA / MQA, or multi-head latent attention.
#[allow(clippy::large_enum_variant)] // one per block; boxing would buy nothing
#[derive(Module, Debug)]
pub enum Attention {
    Mha(CausalSelfAttention),
    Mla(MlaAttention),
}

impl Attention {
    fn forward(&self, x: Tensor<3>, rope: Option<&Rope>) -> Tensor<3> {
        match self {
            Attention::Mha(attn) => attn.forward(x, rope),
            Attention::Mla(mla) => mla.forward(x, rope.expect("validated: MLA uses RoPE")),
        }
    }

    /// New queries (from position `offset`) against everything cached for `layer`, after appending this step's k, v
    /// (or c, k_R).
    fn forward_cached(&self, x: Tensor<3>, rope: Option<&Rope>, step: Step, cache: &mut dyn KvCache) -> Tensor<3> {
        let Step { layer, offset } = step;
        match self {
            Attention::Mha(attn) => {
                let (q, k, v) = attn.qkv(x, rope);
                let spec = attn.spec(q.dims()[3], offset);
                attn.project(cache.attend(layer, q, k, v, &spec))
            }
            Attention::Mla(mla) => {
                let p = mla.project(x, rope.expect("validated: MLA uses RoPE"));
                let [c, k_r] = two(cache.append(layer, vec![p.c, p.k_r]));
                mla.attend_absorbed(MlaProjections { c, k_r, ..p }, offset)
            }
        }
    }
}

/// Which layer a cached forward pass is in, and the position of its first new token.
#[derive(Clone, Copy)]
struct Step {
    layer: usize,
    offset: usize,
}

impl Attention {
    /// One new token per row [B, 1, d], row b against its own cache b: keys padded to the longest row and masked by
    /// length (a sliding window keeps each row's last w keys).
    fn forward_batch(
        &self,
        x: Tensor<3>,
        rope: Option<&Rope>,
        layer: usize,
        caches: &mut [&mut dyn KvCache],
    ) -> Tensor<3> {
        match self {
            Attention::Mha(attn) => {
                let (q, k, v) = attn.qkv(x, rope);
                let ([k, v], lengths) = padded(layer, caches, [k, v], attn.window());
                let spec =
                    AttentionSpec { causal: false, key_lengths: Some(lengths), ..AttentionSpec::causal(q.dims()[3]) };
                attn.attend_with(q, k, v, &spec)
            }
            Attention::Mla(mla) => {
                let p = mla.project(x, rope.expect("validated: MLA uses RoPE"));
                let ([c, k_r], lengths) = padded(layer, caches, [p.c.clone(), p.k_r.clone()], mla.window());
                let spec = AttentionSpec { causal: false, window: None, key_lengths: Some(lengths), ..mla.spec(&p, 0) };
                mla.attend_absorbed_with(MlaProjections { c, k_r, ..p }, &spec)
            }
        }
    }
}

/// Appends row b of each entry [B, n, 1, w] to cache b of `layer` and returns every row's entries (its last `window`
/// when set) zero-padded to the longest, [B, n, T_max, w], with the row lengths.
fn padded(
    layer: usize,
    caches: &mut [&mut dyn KvCache],
    entries: [Tensor<4>; 2],
    window: Option<usize>,
) -> ([Tensor<4>; 2], Vec<usize>) {
    let mut rows: Vec<[Tensor<4>; 2]> = Vec::with_capacity(caches.len());
    let mut lengths = Vec::with_capacity(caches.len());
    for (b, cache) in caches.iter_mut().enumerate() {
        let mine = entries.iter().map(|e| {
            let [_, n, t, w] = e.dims();
            e.clone().slice([b..b + 1, 0..n, 0..t, 0..w])
        });
        let all = two(cache.append(layer, mine.collect())).map(|a| {
            let [_, n, t, w] = a.dims();
            match window {
                Some(win) if t > win => a.slice([0..1, 0..n, t - win..t, 0..w]),
                _ => a,
            }
        });
        lengths.push(all[0].dims()[2]);
        rows.push(all);
    }
    let longest = lengths.iter().copied().max().unwrap_or(0);
    let pad = |a: Tensor<4>| {
        let [_, n, t, w] = a.dims();
        if t == longest {
            a
        } else {
            Tensor::cat(vec![a.clone(), Tensor::zeros([1, n, longest - t, w], &a.device())], 2)
        }
    };
    let (mut first, mut second) = (Vec::new(), Vec::new());
    for [a, b] in rows {
        first.push(pad(a));
        second.push(pad(b));
    }
    ([Tensor::cat(first, 0), Tensor::cat(second, 0)], lengths)
}

fn two(entries: Vec<Tensor<4>>) -> [Tensor<4>; 2] {
    entries.try_into().unwrap_or_else(|e: Vec<_>| panic!("a KV cache returned {} entries for 2", e.len()))
}

#[derive(Module, Debug)]
pub struct Block {
    pub ln_1: Norm,
    pub attn: Attention,
    pub ln_2: Norm,
    pub mlp: Ffn,
    /// Peri-LN's norms on the sub-layer outputs.
    pub ln_1_out: Option<Norm>,
    pub ln_2_out: Option<Norm>,
    #[module(skip)]
    placement: NormPlacement,
}

impl Block {
    fn new(config: &ModelConfig, rng: &mut Rng, device: &Device) -> Self {
        let norm = || Norm::new(config.norm, config.d_model, config.norm_eps, config.bias, device);
        let peri = config.norm_placement == NormPlacement::Peri;
        let attn = match config.attention {
            AttentionKind::Mha => Attention::Mha(CausalSelfAttention::new(config, rng, device)),
            AttentionKind::Mla => Attention::Mla(MlaAttention::new(config, rng, device)),
        };
        Self {
            ln_1: norm(),
            attn,
            ln_2: norm(),
            mlp: Ffn::new(config, rng, device),
            ln_1_out: peri.then(norm),
            ln_2_out: peri.then(norm),
            placement: config.norm_placement,
        }
    }

    fn forward(&self, x: Tensor<3>, rope: Option<&Rope>) -> Tensor<3> {
        self.apply(x, |h| self.attn.forward(h, rope))
    }

    fn forward_cached(&self, x: Tensor<3>, rope: Option<&Rope>, step: Step, cache: &mut dyn KvCache) -> Tensor<3> {
        self.apply(x, |h| self.attn.forward_cached(h, rope, step, cache))
    }

    fn forward_batch(
        &self,
        x: Tensor<3>,
        rope: Option<&Rope>,
        layer: usize,
        caches: &mut [&mut dyn KvCache],
    ) -> Tensor<3> {
        self.apply(x, |h| self.attn.forward_batch(h, rope, layer, caches))
    }

    /// The block with `attn` as its attention sub-layer (full, cached or batched), then the feed-forward sub-layer.
    fn apply(&self, x: Tensor<3>, attn: impl FnOnce(Tensor<3>) -> Tensor<3>) -> Tensor<3> {
        let x = sublayer(self.placement, x, &self.ln_1, self.ln_1_out.as_ref(), attn);
        sublayer(self.placement, x, &self.ln_2, self.ln_2_out.as_ref(), |h| self.mlp.forward(h))
    }
}

#[derive(Module, Debug)]
pub struct Gpt {
    pub wte: Embedding,
    /// Learned positions.
    pub wpe: Option<Embedding>,
    /// Peri-LN's norm of the input embeddings.
    pub ln_emb: Option<Norm>,
    drop: Dropout,
    pub blocks: Vec<Block>,
    /// The final norm of Pre-LN and Peri-LN.
    pub ln_f: Option<Norm>,
    /// The output projection [d, V] when not tied to `wte`.
    pub lm_head: Option<Linear>,
    #[module(skip)]
    config: ModelConfig,
}

impl Gpt {
    /// GPT-2 initialisation from `rng`: embeddings N(0, 0.02), norms γ = 1, β = 0.
    pub fn new(config: &ModelConfig, rng: &mut Rng, device: &Device) -> Self {
        let (d, v) = (config.d_model, config.vocab());
        let norm = || Norm::new(config.norm, d, config.norm_eps, config.bias, device);
        let wte = Embedding { weight: init::normal(rng, [v, d], 0.02, device) };
        let wpe = (config.positions == PositionKind::Learned)
            .then(|| Embedding { weight: init::normal(rng, [config.block_size, d], 0.02, device) });
        let blocks = (0..config.n_layers).map(|_| Block::new(config, rng, device)).collect();
        let placement = config.norm_placement;
        Self {
            wte,
            wpe,
            ln_emb: (placement == NormPlacement::Peri).then(norm),
            drop: DropoutConfig::new(config.dropout).init(),
            blocks,
            ln_f: (placement != NormPlacement::Post).then(norm),
            lm_head: (!config.tie_embeddings).then(|| linear_layer(rng, d, v, 0.02, false, device)),
            config: config.clone(),
        }
    }

    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// Logits [B, T, V] for token ids [B, T] (T ≤ block_size).
    pub fn forward(&self, idx: Tensor<2, Int>) -> Tensor<3> {
        let t = idx.dims()[1];
        let rope = self.rope(0, t, &idx.device());
        let mut x = self.embed(idx, 0);
        for block in &self.blocks {
            x = block.forward(x, rope.as_ref());
        }
        self.logits(x)
    }

    /// Logits [B, V] of the last of the new tokens [B, T_new] at positions `cache.len()..`: every layer appends its
    /// keys and values (or MLA latents) to `cache` and attends with the new queries only,
    /// o_t = softmax(q_t K_{1:t}ᵀ / √d_k) V_{1:t}. Prefill is the first call with the whole prompt.
    pub fn forward_step(&self, idx: Tensor<2, Int>, cache: &mut dyn KvCache) -> Tensor<2> {
        let [b, t] = idx.dims();
        let x = self.hidden_cached(idx, cache);
        let d = x.dims()[2];
        self.logits(x.slice([0..b, t - 1..t, 0..d])).reshape([b, self.config.vocab()])
    }

    /// Logits [B, T_new, V] of every new token, through the cache (teacher forcing against a KV store).
    pub fn forward_step_all(&self, idx: Tensor<2, Int>, cache: &mut dyn KvCache) -> Tensor<3> {
        let x = self.hidden_cached(idx, cache);
        self.logits(x)
    }

    /// Logits [B, V] of one new token per sequence, each sequence with its own cache and length (batched decoding):
    /// row b is embedded and rotated at position `caches[b].len()`, appended to cache b, and attends to its own keys.
    pub fn forward_batch(&self, tokens: &[u32], caches: &mut [&mut dyn KvCache]) -> Tensor<2> {
        let device = self.wte.weight.device();
        let offsets: Vec<usize> = caches.iter().map(|c| c.len()).collect();
        let rows = tokens.iter().zip(&offsets).map(|(&token, &offset)| {
            let id = Tensor::<2, Int>::from_data(TensorData::new(vec![token as i64], [1, 1]), &device);
            self.embed(id, offset)
        });
        let mut x = Tensor::cat(rows.collect(), 0);
        let c = &self.config;
        let rope = (c.positions == PositionKind::Rope)
            .then(|| Rope::per_row(c.rope_theta, c.mla_rope_dim.unwrap_or(c.head_dim()), &offsets, &device));
        for (layer, block) in self.blocks.iter().enumerate() {
            x = block.forward_batch(x, rope.as_ref(), layer, caches);
        }
        self.logits(x).reshape([tokens.len(), c.vocab()])
    }

    /// The last block's output for new tokens at positions `cache.len()..`, appending to `cache` layer by layer.
    fn hidden_cached(&self, idx: Tensor<2, Int>, cache: &mut dyn KvCache) -> Tensor<3> {
        let t = idx.dims()[1];
        let offset = cache.len();
        let rope = self.rope(offset, t, &idx.device());
        let mut x = self.embed(idx, offset);
        for (layer, block) in self.blocks.iter().enumerate() {
            x = block.forward_cached(x, rope.as_ref(), Step { layer, offset }, cache);
        }
        x
    }

    /// h₀ = E[x] (+ P[offset..offset + T] learned, or + PE·(E[x]·√d) sinusoidal), normalised for Peri-LN.
    pub fn embed(&self, idx: Tensor<2, Int>, offset: usize) -> Tensor<3> {
        let [_, t] = idx.dims();
        let device = idx.device();
        let e = self.wte.forward(idx);
        let x = match (&self.wpe, self.config.positions) {
            (Some(wpe), _) => {
                let pos = Tensor::<1, Int>::arange(offset as i64..(offset + t) as i64, &device).reshape([1, t]);
                e + wpe.forward(pos)
            }
            (None, PositionKind::Sinusoidal) => {
                let d = self.config.d_model;
                e * (d as f64).sqrt() + sinusoidal(offset, t, d, &device).unsqueeze()
            }
            _ => e,
        };
        let x = match &self.ln_emb {
            Some(ln) => ln.forward(x),
            None => x,
        };
        self.drop.forward(x)
    }

    /// The rotation tables for positions `offset..offset + t` when the model uses RoPE (width d_R for MLA).
    pub fn rope(&self, offset: usize, t: usize, device: &Device) -> Option<Rope> {
        let c = &self.config;
        let width = c.mla_rope_dim.unwrap_or(c.head_dim());
        (c.positions == PositionKind::Rope).then(|| Rope::new(c.rope_theta, width, offset, t, device))
    }

    /// Logits = norm_f(h) Wᵀ_out, W_out = E when tied.
    pub fn logits(&self, x: Tensor<3>) -> Tensor<3> {
        let x = match &self.ln_f {
            Some(ln) => ln.forward(x),
            None => x,
        };
        match &self.lm_head {
            Some(head) => linear(head, x),
            None => tied_logits(&self.wte, x),
        }
    }

    /// The context length the model allows.
    pub fn block_size(&self) -> usize {
        self.config.block_size
    }

    /// Whether the parameter at `path` is an embedding table (weight decay on these is configurable).
    pub fn is_embedding(path: &str) -> bool {
        path.starts_with("wte.") || path.starts_with("wpe.")
    }
}
