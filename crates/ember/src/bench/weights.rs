//! `ember bench weights`: one model held in several weight formats (f32, the file's own blocks, f16, Q8_0, Q4_0, …):
//! the bytes of its projections and token embedding, and the loss of a text, each against f32.

use anyhow::{Context, Result};
use clap::Args;
use ember_core_model::CausalLm;
use ember_core_model::nn::projection::{Projection, TokenEmbedding};
use ember_core_model::weights::WeightFormat;
use ember_train::loss::text_loss;

use ember_core_model::config::Precision;

use crate::devices::DeviceChoice;
use crate::eval::ScoredText;
use crate::inference::{self, Placement};
use crate::inspect::thousands;

#[derive(Args)]
pub struct BenchWeightsArgs {
    /// The model and the text it is scored on.
    #[command(flatten)]
    scored: ScoredText,
    /// Weight formats, one row each; the first is the reference.
    #[arg(long, value_delimiter = ',', default_value = "f32,native,f16,q8_0,q5_1,q5_0,q4_1,q4_0")]
    formats: Vec<WeightFormat>,
}

pub fn bench_weights(args: BenchWeightsArgs, device: DeviceChoice) -> Result<()> {
    let placement = Placement::new(device, Precision::F32)?;
    if !ember_kernels::packed::has_kernel(&placement.device) {
        anyhow::bail!("bench weights runs on the CPU or wgpu (other devices take every format as f32)");
    }
    println!(
        "bench weights: {} on {}; loss on the last {} tokens of {}\n",
        args.scored.model.display(),
        placement.description,
        args.scored.tokens,
        args.scored.text.display()
    );
    println!("| weights | projection + embedding bytes | loss (nats/token) | perplexity change |");
    println!("|---|---:|---:|---:|");
    let mut reference = None;
    for format in &args.formats {
        let run =
            inference::load(&args.scored.model, &placement, *format).with_context(|| format!("--weights {format}"))?;
        let ids = args.scored.ids(&run.tokenizer)?;
        let loss = text_loss(&run.model, &ids);
        let change = match reference {
            Some(base) => format!("{:+.2} %", ((loss - base) as f64).exp_m1() * 100.0),
            None => "—".to_string(),
        };
        reference.get_or_insert(loss);
        println!("| {format} | {} | {loss:.4} | {change} |", thousands(weight_bytes(&run.model) as f64));
    }
    Ok(())
}

/// The bytes the projections and token embedding take: f32 dense, or their blocks.
fn weight_bytes(model: &CausalLm) -> usize {
    let projection = |p: &Projection| match p {
        Projection::Dense(l) => 4 * l.weight.dims().iter().product::<usize>(),
        Projection::Packed(p) => p.weight().bytes.len(),
    };
    let embedding = match &model.wte {
        TokenEmbedding::Dense(e) => 4 * e.weight.dims().iter().product::<usize>(),
        TokenEmbedding::Packed(p) => p.weight().bytes.len(),
    };
    let blocks: usize = model
        .blocks
        .iter()
        .map(|b| {
            let attn = match &b.attn {
                ember_core_model::causal_lm::Attention::Mha(a) => projection(&a.c_attn) + projection(&a.c_proj),
                ember_core_model::causal_lm::Attention::Mla(m) => projection(&m.c_proj),
            };
            attn + projection(&b.mlp.c_fc) + b.mlp.c_gate.as_ref().map_or(0, projection) + projection(&b.mlp.c_proj)
        })
        .sum();
    embedding + blocks + model.lm_head.as_ref().map_or(0, projection)
}
