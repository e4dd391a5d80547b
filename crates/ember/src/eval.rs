//! `ember eval bleu`: corpus BLEU of a hypothesis file against a reference file, as sacreBLEU scores it by default.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use ember_train::bleu::corpus_bleu;

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

pub fn eval(command: EvalCommand) -> Result<()> {
    match command {
        EvalCommand::Bleu(args) => {
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
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let text = String::from_utf8(bytes).with_context(|| format!("{} is not UTF-8", path.display()))?;
    Ok(text.lines().map(str::to_string).collect())
}
