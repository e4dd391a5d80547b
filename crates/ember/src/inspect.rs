//! `ember inspect`: parameters per part and KV-cache bytes, from a config alone or from a model.

use std::path::PathBuf;

use anyhow::{Context, Result, anyhow, bail};
use clap::Args;
use ember_core_model::config::AttentionKind;
use ember_core_model::import::{self, Source};
use ember_core_model::inspect::{
    kv_cache_bytes, kv_elements_per_token_layer, param_counts, seq2seq_param_counts, state_elements_per_layer,
    state_features,
};
use ember_core_model::seq2seq::Seq2SeqConfig;
use ember_core_model::{ModelConfig, bundle};
use ember_train::translation;

#[derive(Args)]
pub struct InspectArgs {
    /// A TOML config with a [model] table (nothing is built, so any size works).
    #[arg(long, conflicts_with = "model")]
    config: Option<PathBuf>,
    /// A run directory (a language model's or a translator's), Hugging Face directory (MarianMT too) or GGUF file.
    #[arg(long)]
    model: Option<PathBuf>,
    /// Sequences in the batch, for the KV-cache total.
    #[arg(long, default_value_t = 1)]
    batch: usize,
    /// Tokens per sequence, for the KV-cache total (default: the context length).
    #[arg(long)]
    length: Option<usize>,
    /// Bytes per cached element (4 for f32, 2 for f16/bf16, 1 for int8).
    #[arg(long, default_value_t = 2)]
    bytes: usize,
}

/// The validated `[model]` table of a TOML file (the other sections are not read).
pub fn model_config(path: &std::path::Path) -> Result<ModelConfig> {
    let file = path.display();
    let text = ember_core_model::files::read_to_string(path).with_context(|| format!("config {file}"))?;
    let table: toml::Table = toml::from_str(&text).map_err(|e| anyhow!("{file}: {}", e.message()))?;
    let model = table.get("model").cloned().ok_or_else(|| anyhow!("{file}: no [model] table"))?;
    let config: ModelConfig = model.try_into().map_err(|e: toml::de::Error| anyhow!("{file}: {}", e.message()))?;
    config.validate().map_err(|e| anyhow!("{file}: {e}"))?;
    Ok(config)
}

fn config_of(args: &InspectArgs) -> Result<ModelConfig> {
    match (&args.config, &args.model) {
        (Some(path), _) => model_config(path),
        (None, Some(path)) => match Source::of(path)? {
            Source::Run => Ok(bundle::load_model_config(path)?),
            Source::HuggingFace => Ok(import::hf::load(path)?.0),
            Source::Gguf => Ok(import::gguf_model::load_config(path)?),
        },
        (None, None) => bail!("give --config FILE or --model PATH"),
    }
}

/// An encoder–decoder's parameters by part and its decoder's caches: self-attention keys and values per target
/// token, cross-attention keys and values per source token (computed once from the encoder's output).
fn encoder_decoder(s: &Seq2SeqConfig, args: &InspectArgs) {
    let c = &s.model;
    let (b, t, e) = (args.batch, args.length.unwrap_or(c.block_size), args.bytes);
    let vocab = match s.share_embeddings {
        true => format!("joint vocabulary {}", thousands(s.src_vocab)),
        false => format!("vocabularies {} (source) and {} (target)", thousands(s.src_vocab), thousands(s.tgt_vocab)),
    };
    println!("encoder–decoder: {} + {} layers, {}, {vocab}", s.encoder_layers, s.decoder_layers, shape(c));
    print_counts(&seq2seq_param_counts(s));
    let decoder = ModelConfig { n_layers: s.decoder_layers, ..c.clone() };
    let per_layer = kv_elements_per_token_layer(&decoder);
    println!("decoder caches at {e} bytes per element: 2·g·d_h = {per_layer} elements per token per layer");
    println!("  per token            {}", bytes(kv_cache_bytes(&decoder, 1, 1, e)));
    // Keys and values of t target tokens (self-attention) and of t source tokens (cross-attention): the same size.
    let cache = bytes(kv_cache_bytes(&decoder, b, t, e));
    println!("  self-attention  {b} × {t} target tokens {cache}");
    println!("  cross-attention {b} × {t} source tokens {cache}");
}

/// A layer's shape: width, heads (MHA, GQA, MQA or MLA), FFN, positions and norms.
fn shape(c: &ModelConfig) -> String {
    let kind = match (c.attention, c.kv_heads()) {
        (AttentionKind::Mla, _) => {
            format!("MLA d_c {} d_R {}", c.mla_latent_dim.unwrap_or(0), c.mla_rope_dim.unwrap_or(0))
        }
        (_, g) if g == c.n_heads => "MHA".to_string(),
        (_, 1) => "MQA".to_string(),
        (_, g) => format!("GQA g {g}"),
    };
    format!(
        "d {}, {} heads of {} ({kind}), ffn {:?} {}, positions {:?}, norm {:?} {:?}",
        c.d_model,
        c.n_heads,
        c.head_dim(),
        c.ffn,
        c.ffn_dim(),
        c.positions,
        c.norm,
        c.norm_placement
    )
}

/// The parameter table: a line per part and the total.
fn print_counts(counts: &[(&str, u128)]) {
    println!("parameters");
    for (part, n) in counts {
        println!("  {part:<20} {:>18}", thousands(*n));
    }
    println!("  {:<20} {:>18}", "total", thousands(counts.iter().map(|(_, n)| *n).fold(0, u128::saturating_add)));
}

/// `n` bytes in binary units; None (an overflow) as such.
fn bytes(n: Option<u128>) -> String {
    let Some(n) = n else { return "more than 2^128 B".into() };
    const UNITS: [&str; 7] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    let mut v = n as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit < UNITS.len() - 1 {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 { format!("{n} B") } else { format!("{v:.2} {}", UNITS[unit]) }
}

pub fn thousands(n: impl std::fmt::Display) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, ch) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(ch);
    }
    out
}

pub fn inspect(args: InspectArgs) -> Result<()> {
    let translator = match args.model.as_deref().filter(|p| p.is_dir()) {
        Some(dir) => translation::seq2seq_config(dir)?,
        None => None,
    };
    if let Some(s) = translator {
        encoder_decoder(&s, &args);
        return Ok(());
    }
    let c = config_of(&args)?;
    let (b, t, e) = (args.batch, args.length.unwrap_or(c.block_size), args.bytes);
    let vocab = c.vocab_size.map_or("from tokenizer".into(), thousands);
    println!("model: {} layers, {}, vocab {vocab}", c.n_layers, shape(&c));
    print_counts(&param_counts(&c));
    if let Some(r) = state_features(&c) {
        let per_layer = state_elements_per_layer(&c, r);
        let layer_bytes = (per_layer as u128).checked_mul(e as u128);
        let total = |sequences: usize| layer_bytes.and_then(|n| n.checked_mul(c.n_layers as u128 * sequences as u128));
        println!("recurrent state (linear attention, no keys kept) at {e} bytes per element");
        println!("  per layer            g·(r·d_h + r) = {per_layer} elements = {}", bytes(layer_bytes));
        println!("  per sequence         {} at any length", bytes(total(1)));
        println!("  {b} sequences{:>w$}{}", "", bytes(total(b)), w = 9usize.saturating_sub(b.to_string().len()).max(1));
        let softmax = ModelConfig { attention_kernel: Default::default(), ..c.clone() };
        println!("  softmax keys instead {} for {b} × {t} tokens", bytes(kv_cache_bytes(&softmax, b, t, e)));
        return Ok(());
    }
    let per_layer = kv_elements_per_token_layer(&c);
    let formula = match c.attention {
        AttentionKind::Mla => "d_c + d_R",
        AttentionKind::Mha => "2·g·d_h",
    };
    println!("KV cache at {e} bytes per element");
    let per_layer_bytes = (per_layer as u128).checked_mul(e as u128);
    println!("  per token per layer  {formula} = {per_layer} elements = {}", bytes(per_layer_bytes));
    println!("  per token            {}", bytes(kv_cache_bytes(&c, 1, 1, e)));
    println!(
        "  {b} × {t} tokens{:>w$}{}",
        "",
        bytes(kv_cache_bytes(&c, b, t, e)),
        w = 8usize.saturating_sub(format!("{b}{t}").len()).max(1)
    );
    if c.attention == AttentionKind::Mha {
        let with = |g: usize| bytes(kv_cache_bytes(&ModelConfig { n_kv_heads: Some(g), ..c.clone() }, b, t, e));
        let gqa = if c.n_heads % 8 == 0 { 8 } else { c.kv_heads() };
        println!("  the same model as MHA {}, GQA g = {gqa} {}, MQA {}", with(c.n_heads), with(gqa), with(1));
        let state = |r: usize| {
            let factors = [state_elements_per_layer(&c, r), e, c.n_layers, b];
            bytes(factors.into_iter().try_fold(1u128, |product, n| product.checked_mul(n as u128)))
        };
        println!(
            "  with linear attention (recurrent state, any length): elu + 1 {}, FAVOR+ r = 256 {}",
            state(c.head_dim()),
            state(256)
        );
    }
    Ok(())
}
