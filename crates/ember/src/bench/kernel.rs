//! `ember bench kernel`: a trained softmax model run with randomized approximations of its attention in place of
//! softmax, without retraining: FAVOR+ with r random features per head, and each query row attending to s keys
//! sampled in proportion to their norms, or to its own scores on a low-dimensional Gaussian sketch of q and k. For
//! each r and s, several draws: the relative error of every layer's attention output on the exact model's own
//! queries, keys and values, and the loss of a text against the exact model's. The estimators have a standard
//! deviation O(1/√r) (O(1/√s)); the tables print that line through the smallest r (s) beside the measured error, and
//! the SVG plots them on log–log axes.

use std::path::PathBuf;

use anyhow::{Context, Result, anyhow, bail};
use burn::tensor::{Int, Tensor, TensorData};
use clap::Args;
use ember_core_model::cache::{KvCache, attend_appended};
use ember_core_model::config::Precision;
use ember_core_model::weights::WeightFormat;
use ember_kernels::{AttentionSpec, Similarity, attention};
use ember_serve::kv::ContiguousCache;
use ember_train::loss::text_loss;
use ember_train::plot::{Axes, Series, line_svg};

use crate::devices::DeviceChoice;
use crate::eval::ScoredText;
use crate::inference::{self, Placement};

#[derive(Args)]
pub struct BenchKernelArgs {
    /// The softmax model and the text it is scored on.
    #[command(flatten)]
    scored: ScoredText,
    /// Random features per head, one row of the FAVOR+ table each.
    #[arg(long, value_delimiter = ',', default_value = "16,64,256,1024")]
    features: Vec<usize>,
    /// Keys sampled per query row, one row of each key-sampling table.
    #[arg(long, value_delimiter = ',', default_value = "4,8,16,32")]
    keys: Vec<usize>,
    /// Dimensions of the Gaussian sketch of q and k whose scores the second key-sampling table draws by.
    #[arg(long, default_value_t = 8)]
    sketch: usize,
    /// Draws of the features (the keys) per row.
    #[arg(long, default_value_t = 3)]
    draws: u64,
    /// Writes the error against r and s, with the O(1/√r) lines, to this SVG file.
    #[arg(long)]
    svg: Option<PathBuf>,
}

fn row(ids: &[u32], device: &burn::tensor::Device) -> Tensor<2, Int> {
    let ids: Vec<i64> = ids.iter().map(|&i| i as i64).collect();
    let t = ids.len();
    Tensor::from_data(TensorData::new(ids, [1, t]), device)
}

/// A contiguous store that also keeps what every layer attended with: its q, k, v and spec.
struct Probe {
    store: ContiguousCache,
    layers: Vec<([Tensor<4>; 3], AttentionSpec)>,
}

impl KvCache for Probe {
    fn len(&self) -> usize {
        self.store.len()
    }
    fn bytes(&self) -> usize {
        self.store.bytes()
    }
    fn clear(&mut self) {
        self.store.clear();
    }
    fn append(&mut self, layer: usize, entries: [Tensor<4>; 2]) -> [Tensor<4>; 2] {
        self.store.append(layer, entries)
    }
    fn attend(&mut self, layer: usize, q: Tensor<4>, k: Tensor<4>, v: Tensor<4>, spec: &AttentionSpec) -> Tensor<4> {
        self.layers.push(([q.clone(), k.clone(), v.clone()], spec.clone()));
        attend_appended(&mut self.store, layer, q, k, v, spec)
    }
}

/// ‖Ŷ − Y‖_F / ‖Y‖_F of each layer's attention output with `similarity` against softmax's, averaged over layers.
fn output_error(layers: &[([Tensor<4>; 3], AttentionSpec)], similarity: impl Fn(usize) -> Similarity) -> f64 {
    let norm = |x: Tensor<4>| (x.clone() * x).sum().into_scalar::<f32>() as f64;
    let errors = layers.iter().enumerate().map(|(i, ([q, k, v], spec))| {
        let exact = attention(q.clone(), k.clone(), v.clone(), spec);
        let spec = AttentionSpec { similarity: similarity(i), ..spec.clone() };
        let approximate = attention(q.clone(), k.clone(), v.clone(), &spec);
        (norm(approximate - exact.clone()) / norm(exact)).sqrt()
    });
    errors.sum::<f64>() / layers.len() as f64
}

/// One row of a table: the mean output error and the losses over the draws.
struct Row {
    size: usize,
    error: f64,
    losses: Vec<f64>,
}

pub fn bench_kernel(args: BenchKernelArgs, device: DeviceChoice) -> Result<()> {
    if args.features.contains(&0) || args.keys.contains(&0) || args.draws == 0 || args.sketch == 0 {
        bail!("--features, --keys, --draws and --sketch must be at least 1");
    }
    // FAVOR+'s feature matrices are r × d_h per head: bounded as `model.favor_features` is.
    const MOST: usize = 1 << 20;
    if let Some(r) = args.features.iter().chain(&args.keys).find(|&&n| n > MOST) {
        bail!("--features and --keys take at most {MOST}, not {r}");
    }
    let placement = Placement::new(device, Precision::F32)?;
    let run = inference::load(&args.scored.model, &placement, WeightFormat::F32)?;
    let (device, description) = (placement.device, placement.description);
    let ids = args.scored.ids(&run.tokenizer)?;
    run.model
        .clone()
        .with_similarity(|_| Similarity::Softmax)
        .ok_or_else(|| anyhow!("{}: MLA layers have softmax attention only", args.scored.model.display()))?;
    let exact = text_loss(&run.model, &ids);
    // Every layer's q, k, v on the first window, from the exact model.
    let window = &ids[..ids.len().min(run.model.block_size())];
    let mut probe = Probe { store: ContiguousCache::new(window.len()), layers: Vec::new() };
    run.model.forward_step_all(row(window, &device), &mut probe);
    println!(
        "bench kernel: {} on {description}: the last {} tokens of {}, softmax replaced without retraining; output \
         error = ‖Ŷ − Y‖/‖Y‖ of each layer's attention on the exact model's q, k, v over the first {} tokens, \
         averaged over layers and {} draws",
        args.scored.model.display(),
        ids.len(),
        args.scored.text.display(),
        window.len(),
        args.draws
    );
    println!("exact softmax: {exact:.4} nats/token");
    let measure = |sizes: &[usize], similarity: &dyn Fn(usize, u64) -> Similarity| -> Vec<Row> {
        sizes
            .iter()
            .map(|&size| {
                let (mut error, mut losses) = (0.0, Vec::new());
                for draw in 0..args.draws {
                    let seed = |layer: usize| draw * 1_000_003 + layer as u64;
                    let draws = |layer: usize| similarity(size, seed(layer));
                    error += output_error(&probe.layers, draws) / args.draws as f64;
                    let model = run.model.clone().with_similarity(draws).expect("checked above");
                    losses.push(text_loss(&model, &ids));
                }
                Row { size, error, losses }
            })
            .collect()
    };
    let favor = measure(&args.features, &|features, seed| Similarity::Favor { features, seed });
    print_table("FAVOR+", "features r", &favor, exact);
    let sampled = measure(&args.keys, &|keys, seed| Similarity::SampledKeys { keys, seed, sketch: None });
    print_table("keys sampled by norm", "keys s", &sampled, exact);
    let sketch = Some(args.sketch);
    let sketched = measure(&args.keys, &|keys, seed| Similarity::SampledKeys { keys, seed, sketch });
    print_table(
        &format!("keys sampled by their scores on a {}-dimensional sketch", args.sketch),
        "keys s",
        &sketched,
        exact,
    );
    if let Some(path) = &args.svg {
        let points = |rows: &[Row]| rows.iter().map(|r| (r.size as f64, r.error)).collect::<Vec<_>>();
        let theory = |rows: &[Row]| rows.iter().map(|r| (r.size as f64, root_line(rows)(r.size))).collect::<Vec<_>>();
        let (f, ft, s, st) = (points(&favor), theory(&favor), points(&sampled), theory(&sampled));
        let (k, kt) = (points(&sketched), theory(&sketched));
        let series = [
            Series { name: "FAVOR+, measured", color: "#d62728", points: &f },
            Series { name: "FAVOR+, c/√r", color: "#f1948a", points: &ft },
            Series { name: "keys by norm, measured", color: "#1f77b4", points: &s },
            Series { name: "keys by norm, c/√s", color: "#7fb3d5", points: &st },
            Series { name: "keys by sketch, measured", color: "#2ca02c", points: &k },
            Series { name: "keys by sketch, c/√s", color: "#98df8a", points: &kt },
        ];
        let axes = Axes {
            title: "Attention output error against features r and sampled keys s",
            x: "r or s",
            y: "‖Ŷ − Y‖ / ‖Y‖",
            log: true,
        };
        std::fs::write(path, line_svg(&axes, &series)).with_context(|| path.display().to_string())?;
        println!("\nwrote {}", path.display());
    }
    Ok(())
}

/// The O(1/√n) line through the first row: c/√n with c = error₀·√n₀.
fn root_line(rows: &[Row]) -> impl Fn(usize) -> f64 + use<> {
    let c = rows.first().map_or(0.0, |r| r.error * (r.size as f64).sqrt());
    move |n| c / (n as f64).sqrt()
}

fn print_table(name: &str, size: &str, rows: &[Row], exact: f64) {
    let line = root_line(rows);
    println!("\n{name}\n");
    println!("| {size} | output error | c/√{} | loss, mean (min … max) | Δ vs softmax |", &size[size.len() - 1..]);
    println!("|---:|---:|---:|---:|---:|");
    for r in rows {
        let mean = r.losses.iter().sum::<f64>() / r.losses.len() as f64;
        let (lo, hi) = r.losses.iter().fold((f64::MAX, f64::MIN), |(lo, hi), &l| (lo.min(l), hi.max(l)));
        println!(
            "| {} | {:.4} | {:.4} | {mean:.4} ({lo:.4} … {hi:.4}) | {:+.4} |",
            r.size,
            r.error,
            line(r.size),
            mean - exact
        );
    }
}
