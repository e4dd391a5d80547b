//! `ember eval bleu`: corpus BLEU of a hypothesis file against a reference file, as sacreBLEU scores it by default;
//! `ember eval --model RUN_DIR --data test.tsv`: the BLEU of a translation model on a test set;
//! `ember eval perplexity`: a language model's loss and perplexity on a text.

use ember_core_model::config::Precision;
use ember_core_model::weights::WeightFormat;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use ember_train::bleu::corpus_bleu;

use crate::devices::DeviceChoice;
use crate::inference::{self, Placement};

#[derive(Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct EvalArgs {
    #[command(subcommand)]
    command: Option<EvalCommand>,
    /// A translation run directory to score on --data.
    #[arg(long, requires = "data")]
    model: Option<PathBuf>,
    /// A TSV test set (`source<TAB>reference`).
    #[arg(long, requires = "model")]
    data: Option<PathBuf>,
    /// Beam width (default: 4, or a MarianMT directory's num_beams).
    #[arg(long)]
    beam: Option<usize>,
    /// Length penalty exponent α (default: 0.6, or a MarianMT directory's length_penalty).
    #[arg(long)]
    lenpen: Option<f64>,
}

#[derive(Subcommand)]
pub enum EvalCommand {
    /// Corpus BLEU (13a tokenisation, exponential smoothing, brevity penalty) of line-aligned files.
    Bleu(BleuArgs),
    /// A language model's mean loss and perplexity on the last tokens of a text, in windows of its context.
    Perplexity(PerplexityArgs),
}

/// A language model and the text it is scored on.
#[derive(Args)]
pub struct ScoredText {
    /// A run directory, Hugging Face directory or GGUF file.
    #[arg(long)]
    pub model: PathBuf,
    /// A UTF-8 text whose last --tokens tokens are scored (in windows of the model's context).
    #[arg(long)]
    pub text: PathBuf,
    #[arg(long, default_value_t = 4096)]
    pub tokens: usize,
}

/// Tokens encoded beyond those kept where a text is read only in part (see [`text_ids`]).
const CUT_MARGIN: usize = 64;

/// Which end of a text [`text_ids`] keeps.
#[derive(Clone, Copy, PartialEq)]
pub enum TextEnd {
    First,
    Last,
}

/// The first or last `tokens` token ids of the UTF-8 text at `path` under `tokenizer` (fewer if the text has fewer).
/// Only that end of the file is read and encoded: a part cut at a line, doubled until it encodes to [`CUT_MARGIN`]
/// more tokens than are kept, so the tokens a cut could change (a whitespace run, a BOS) are never among them.
pub fn text_ids(path: &Path, tokenizer: &tokenizers::Tokenizer, tokens: usize, end: TextEnd) -> Result<Vec<u32>> {
    let context = || path.display().to_string();
    ember_core_model::files::check_regular(path).with_context(context)?;
    let file = std::fs::File::open(path).with_context(context)?;
    let size = file.metadata().with_context(context)?.len();
    let mut part = (tokens as u64).saturating_mul(8).max(4096).min(size);
    loop {
        let start = if end == TextEnd::Last { size - part } else { 0 };
        let mut bytes = vec![0; part as usize];
        std::os::unix::fs::FileExt::read_exact_at(&file, &mut bytes, start).with_context(context)?;
        // Whole lines only: from the first line start after `start`, or to the last line end before the cut.
        let whole = part == size;
        let lines = match end {
            _ if whole => Some(0..bytes.len()),
            TextEnd::Last => bytes.iter().position(|&b| b == b'\n').map(|at| at + 1..bytes.len()),
            TextEnd::First => bytes.iter().rposition(|&b| b == b'\n').map(|at| 0..at + 1),
        };
        if let Some(lines) = lines {
            let first = start as usize + lines.start;
            let text = std::str::from_utf8(&bytes[lines]).map_err(|e| {
                anyhow::anyhow!("{}: not UTF-8 text (invalid byte at offset {})", context(), first + e.valid_up_to())
            })?;
            let ids = ember_core_model::tokenizer::encode(tokenizer, text)?;
            if whole || ids.len() >= tokens.saturating_add(CUT_MARGIN) {
                let keep = match end {
                    TextEnd::Last => ids.len().saturating_sub(tokens)..ids.len(),
                    TextEnd::First => 0..ids.len().min(tokens),
                };
                return Ok(ids[keep].to_vec());
            }
        }
        part = part.saturating_mul(2).min(size);
    }
}

impl ScoredText {
    /// The text's last `tokens` token ids (at least 2) under `tokenizer`.
    pub fn ids(&self, tokenizer: &tokenizers::Tokenizer) -> Result<Vec<u32>> {
        let path = &self.text;
        let ids = text_ids(path, tokenizer, self.tokens, TextEnd::Last)?;
        if ids.len() < 2 {
            bail!("{}: fewer than 2 tokens to score", path.display());
        }
        Ok(ids)
    }
}

#[derive(Args)]
pub struct PerplexityArgs {
    #[command(flatten)]
    scored: ScoredText,
    /// How projections and the token embedding are held on the CPU and wgpu: native (a GGUF file's blocks, used as they are;
    /// a run directory as stored), f32, or converted to f16, bf16, q8_0, q4_0, q4_1, q5_0 or q5_1.
    #[arg(long, default_value = "native")]
    weights: WeightFormat,
}

#[derive(Args)]
pub struct BleuArgs {
    /// Hypotheses, one sentence a line.
    #[arg(long)]
    hyp: PathBuf,
    /// References, line-aligned with the hypotheses.
    #[arg(long = "ref")]
    reference: PathBuf,
}

pub fn eval(args: EvalArgs, device: DeviceChoice) -> Result<()> {
    match (args.command, args.model, args.data) {
        (None, Some(model), Some(data)) => crate::translate::evaluate(&model, &data, args.beam, args.lenpen, device),
        (None, _, _) => {
            bail!("give `ember eval bleu --hyp FILE --ref FILE` or `ember eval --model RUN_DIR --data FILE`")
        }
        (Some(EvalCommand::Perplexity(args)), _, _) => perplexity(args, device),
        (Some(EvalCommand::Bleu(args)), _, _) => {
            let (hyps, refs) = (lines(&args.hyp)?, lines(&args.reference)?);
            if hyps.len() != refs.len() {
                bail!(
                    "{} has {} lines but {} has {}: hypotheses and references must be line-aligned",
                    args.hyp.display(),
                    hyps.len(),
                    args.reference.display(),
                    refs.len()
                );
            }
            println!("{}", corpus_bleu(hyps.iter().map(String::as_str), refs.iter().map(String::as_str)));
            Ok(())
        }
    }
}

fn perplexity(args: PerplexityArgs, device: DeviceChoice) -> Result<()> {
    let (weights, args) = (args.weights, args.scored);
    let placement = Placement::new(device, Precision::F32)?;
    let run = inference::load(&args.model, &placement, weights)?;
    let description = placement.description;
    let ids = args.ids(&run.tokenizer)?;
    let loss = ember_train::loss::text_loss(&run.model, &ids);
    println!(
        "{} on {description}: loss {loss:.4} nats/token, perplexity {:.3}, on the last {} tokens of {}",
        args.model.display(),
        loss.exp(),
        ids.len(),
        args.text.display()
    );
    Ok(())
}

fn lines(path: &Path) -> Result<Vec<String>> {
    let bytes = ember_core_model::files::read(path).with_context(|| format!("reading {}", path.display()))?;
    let text = String::from_utf8(bytes).with_context(|| format!("{} is not UTF-8", path.display()))?;
    Ok(text.lines().map(str::to_string).collect())
}
