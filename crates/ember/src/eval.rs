//! `ember eval bleu`: corpus BLEU of a hypothesis file against a reference file, as sacreBLEU scores it by default;
//! `ember eval --model RUN_DIR --data test.tsv`: the BLEU of a translation model on a test set.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use ember_train::bleu::corpus_bleu;

use crate::devices::DeviceChoice;

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
    #[arg(long, default_value_t = 4)]
    beam: usize,
    #[arg(long, default_value_t = 0.6)]
    lenpen: f64,
}

#[derive(Subcommand)]
pub enum EvalCommand {
    /// Corpus BLEU (13a tokenisation, exponential smoothing, brevity penalty) of line-aligned files.
    Bleu(BleuArgs),
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
        (None, Some(model), Some(data)) => {
            crate::translate::evaluate(&model, &data, args.beam.max(1), args.lenpen, device)
        }
        (None, _, _) => {
            bail!("give `ember eval bleu --hyp FILE --ref FILE` or `ember eval --model RUN_DIR --data FILE`")
        }
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

fn lines(path: &Path) -> Result<Vec<String>> {
    let bytes = ember_core_model::files::read(path).with_context(|| format!("reading {}", path.display()))?;
    let text = String::from_utf8(bytes).with_context(|| format!("{} is not UTF-8", path.display()))?;
    Ok(text.lines().map(str::to_string).collect())
}
