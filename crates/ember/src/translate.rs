//! Translation commands: training from a `[seq2seq]` config (and resuming it), `ember translate` (streams, keeps input order),
//! `ember average` (checkpoint averaging) and `ember eval --model --data` (BLEU on a TSV test set).

use std::io::{BufRead, IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::rc::Rc;

use anyhow::{Context, Result, bail};
use burn::tensor::Device;
use clap::Args;
use ember_core_model::seq2seq::Seq2Seq;
use ember_formats::generation::Generation;
use ember_serve::beam::{BeamConfig, Limit, Search, translate_batch};
use ember_train::bleu::corpus_bleu;
use ember_train::collective::Collective;
use ember_train::parallel::{Vocabularies, encode, read_tsv, source_batch};
use ember_train::trainer::TaskError;
use ember_train::translation::{self, BleuOf, TranslationConfig, TranslationTrainer, Translator};

use crate::devices::{self, DeviceChoice};
use crate::progress::Progress;
use crate::run_dir;

/// Sentences translated together.
const CHUNK: usize = 32;

#[derive(Args)]
pub struct TranslateArgs {
    /// A translation run directory (`ember train` with a `[seq2seq]` config, or `ember average`), or a MarianMT
    /// directory (an OPUS-MT model: config.json, model.safetensors, vocab.json, source.spm, target.spm).
    #[arg(long)]
    model: PathBuf,
    /// Source sentences, one a line (default: standard input).
    #[arg(long)]
    input: Option<PathBuf>,
    /// Beam width (default: 4, or a MarianMT directory's num_beams).
    #[arg(long)]
    beam: Option<usize>,
    /// Length penalty exponent α: of ((5 + |y|) / 6)^α (default 0.6), or of |y|^α for a MarianMT directory, whose
    /// generation_config.json gives the default as for transformers' generate().
    #[arg(long)]
    lenpen: Option<f64>,
}

#[derive(Args)]
pub struct AverageArgs {
    /// A translation run directory with checkpoints.
    #[arg(long)]
    model: PathBuf,
    /// How many of the last checkpoints to average.
    #[arg(long, default_value_t = 5)]
    last: usize,
    /// The run directory to write (default: MODEL/averaged).
    #[arg(long)]
    out: Option<PathBuf>,
}

/// The widest beam: each hypothesis is a row of the decoder's batch (fairseq's default is 5, wide searches 50–200).
const MAX_BEAM: usize = 1024;

/// --beam and --lenpen as given: a beam of 1 to [`MAX_BEAM`] and a finite length penalty.
fn check(beam: Option<usize>, lenpen: Option<f64>) -> Result<()> {
    if let Some(beam) = beam.filter(|b| !(1..=MAX_BEAM).contains(b)) {
        bail!("--beam must be from 1 to {MAX_BEAM}, not {beam}");
    }
    if let Some(lenpen) = lenpen.filter(|l| !l.is_finite()) {
        bail!("--lenpen must be a finite number, not {lenpen}");
    }
    Ok(())
}

/// The search a translator decodes with: a MarianMT directory's `generate()` defaults (`generation`, from its
/// generation_config.json), else fairseq's (beam 4, GNMT's α 0.6, up to the source's length + 50); `beam` and
/// `lenpen` replace the width and α.
fn search(
    generation: Option<&Generation>,
    vocab: &Vocabularies,
    beam: Option<usize>,
    lenpen: Option<f64>,
) -> BeamConfig {
    let config = match generation {
        None => BeamConfig {
            beam: 4,
            alpha: 0.6,
            search: Search::Fairseq,
            bos: vocab.bos,
            eos: vocab.eos,
            limit: Limit::PastSource(50),
            banned: Vec::new(),
            forced_eos: false,
        },
        Some(g) => BeamConfig {
            beam: g.num_beams,
            alpha: g.length_penalty,
            search: Search::Transformers(g.early_stopping),
            bos: vocab.bos,
            eos: vocab.eos,
            limit: Limit::Tokens(g.max_new_tokens),
            banned: g.banned.clone(),
            forced_eos: g.forced_eos.is_some(),
        },
    };
    BeamConfig { beam: beam.unwrap_or(config.beam), alpha: lenpen.unwrap_or(config.alpha), ..config }
}

/// Translations of `lines` in order: an empty line gives an empty line; a source longer than the model's positions
/// is cut to fit (reported on stderr with its line number, counted from `first_line`).
fn translate_lines(
    model: &Seq2Seq,
    vocab: &Vocabularies,
    lines: &[String],
    config: &BeamConfig,
    first_line: usize,
    device: &Device,
) -> Result<Vec<String>> {
    let limit = model.config().model.block_size - 1;
    let mut sources = Vec::with_capacity(lines.len());
    for (i, line) in lines.iter().enumerate() {
        let mut ids = encode(&vocab.source, line.trim())?;
        if ids.len() > limit {
            eprintln!("warning: line {}: {} tokens, cut to the model's {limit}", first_line + i, ids.len());
            ids.truncate(limit);
        }
        sources.push(ids);
    }
    let mut out = vec![String::new(); lines.len()];
    let rows: Vec<usize> = (0..lines.len()).filter(|&i| !sources[i].is_empty()).collect();
    if rows.is_empty() {
        return Ok(out);
    }
    let rows_ids: Vec<&[u32]> = rows.iter().map(|&i| sources[i].as_slice()).collect();
    let (src, lengths) = source_batch(&rows_ids, vocab.eos, device);
    for (&i, ids) in rows.iter().zip(translate_batch(model, src, &lengths, config, device)) {
        out[i] = vocab
            .target
            .decode(&ids, true)
            .map_err(|e| anyhow::anyhow!("decoding a translation: {e}"))?
            .trim()
            .to_string();
    }
    Ok(out)
}

pub fn translate(args: TranslateArgs, choice: DeviceChoice) -> Result<()> {
    check(args.beam, args.lenpen)?;
    let (device, _) = devices::select(choice)?;
    let t = translation::load(&args.model, None, &device)?;
    let config = search(t.generation.as_ref(), &t.vocab, args.beam, args.lenpen);
    let reader: Box<dyn BufRead> = match &args.input {
        Some(path) => Box::new(std::io::BufReader::new(
            std::fs::File::open(path).with_context(|| format!("reading {}", path.display()))?,
        )),
        None => Box::new(std::io::stdin().lock()),
    };
    // Typed input is answered line by line; files and pipes are translated CHUNK sentences at a time.
    let size = if args.input.is_none() && std::io::stdin().is_terminal() { 1 } else { CHUNK };
    let mut stdout = std::io::stdout().lock();
    let (mut chunk, mut first) = (Vec::with_capacity(size), 1);
    let mut lines = reader.lines().enumerate();
    loop {
        let next = lines.next();
        if let Some((i, line)) = &next {
            let line = line.as_ref().map_err(|e| anyhow::anyhow!("input line {}: {e}", i + 1))?;
            chunk.push(line.clone());
        }
        if chunk.len() == size || (next.is_none() && !chunk.is_empty()) {
            for out in translate_lines(&t.model, &t.vocab, &chunk, &config, first, &device)? {
                writeln!(stdout, "{out}")?;
            }
            stdout.flush()?;
            first += chunk.len();
            chunk.clear();
        }
        if next.is_none() {
            return Ok(());
        }
    }
}

pub fn average(args: AverageArgs) -> Result<()> {
    let out = args.out.unwrap_or_else(|| args.model.join("averaged"));
    let steps = translation::average(&args.model, args.last, &out)?;
    println!("averaged checkpoints of steps {steps:?} into {}", out.display());
    Ok(())
}

/// Corpus BLEU of a translator on a TSV test set.
pub fn evaluate(
    model: &Path,
    data: &Path,
    beam: Option<usize>,
    lenpen: Option<f64>,
    choice: DeviceChoice,
) -> Result<()> {
    check(beam, lenpen)?;
    let (device, _) = devices::select(choice)?;
    let t = translation::load(model, None, &device)?;
    score(&t, &read_tsv(data)?, beam, lenpen, &device)
}

/// Prints the corpus BLEU of translator `t` on `pairs` (its own search, `beam` and `lenpen` replacing its width
/// and α).
fn score(
    t: &Translator,
    pairs: &[(String, String)],
    beam: Option<usize>,
    lenpen: Option<f64>,
    device: &Device,
) -> Result<()> {
    let config = search(t.generation.as_ref(), &t.vocab, beam, lenpen);
    let hyps = translate_all(&t.model, &t.vocab, pairs, &config, device)?;
    let bleu = corpus_bleu(hyps.iter().map(String::as_str), pairs.iter().map(|(_, r)| r.as_str()));
    println!("{} ({} sentences, beam {}, lenpen {})", bleu, pairs.len(), config.beam, config.alpha);
    Ok(())
}

fn translate_all(
    model: &Seq2Seq,
    vocab: &Vocabularies,
    pairs: &[(String, String)],
    config: &BeamConfig,
    device: &Device,
) -> Result<Vec<String>> {
    let mut hyps = Vec::with_capacity(pairs.len());
    for (c, chunk) in pairs.chunks(CHUNK).enumerate() {
        let sources: Vec<String> = chunk.iter().map(|(s, _)| s.clone()).collect();
        hyps.extend(translate_lines(model, vocab, &sources, config, c * CHUNK + 1, device)?);
    }
    Ok(hyps)
}

/// Greedy BLEU of a model on validation pairs, as training evaluates it.
fn greedy_bleu(device: &Device) -> Box<BleuOf> {
    let device = device.clone();
    Box::new(move |model: &Seq2Seq, vocab: &Vocabularies, pairs: &[(String, String)]| -> Result<f64, TaskError> {
        let hyps = translate_all(model, vocab, pairs, &search(None, vocab, Some(1), None), &device)?;
        Ok(corpus_bleu(hyps.iter().map(String::as_str), pairs.iter().map(|(_, r)| r.as_str())).score)
    })
}

/// `ember train` on a translation config: trains, then scores the test set (when configured) with beam 4.
/// Trains alone or as one rank of `collective`: rank 0 trains the vocabularies and writes the run directory, the
/// other ranks read them from it.
pub fn train(
    config_path: &Path,
    config: TranslationConfig,
    force: bool,
    choice: DeviceChoice,
    collective: Rc<dyn Collective>,
) -> Result<()> {
    let writes = collective.rank() == 0;
    let _lock = run_dir::lock_on_rank_0(&config.train.out_dir, collective.rank())?;
    if writes {
        run_dir::check_new(&config.train.out_dir, force)?;
    }
    let (device, description, precision) =
        devices::select_local_in(choice, collective.local_rank(), config.model.dtype)?;
    crate::ranks::announce(&*collective, &description);
    let bleu = greedy_bleu(&device);
    let trainer = match writes {
        true => {
            println!("training translation model from {} in {precision} on {description}", config_path.display());
            let trainer = TranslationTrainer::new(config, &device, bleu)?;
            collective.barrier();
            trainer
        }
        false => {
            collective.barrier(); // rank 0 has written the vocabularies
            TranslationTrainer::replica(config, &device, bleu)?
        }
    };
    run(trainer.with_precision(precision), collective, choice)
}

/// `ember train --resume RUN_DIR` of a translation run: continues from its checkpoint, with its config.toml (`config`,
/// where the overrides may have raised `train.max_steps`) and vocabularies.
pub fn resume(
    run_dir: &Path,
    config: TranslationConfig,
    choice: DeviceChoice,
    collective: Rc<dyn Collective>,
) -> Result<()> {
    let writes = collective.rank() == 0;
    let _lock = run_dir::lock_on_rank_0(run_dir, collective.rank())?;
    let (device, description, precision) =
        devices::select_local_in(choice, collective.local_rank(), config.model.dtype)?;
    crate::ranks::announce(&*collective, &description);
    if writes {
        println!("resuming translation run {} on {description}", run_dir.display());
    }
    let trainer = TranslationTrainer::resume(config, run_dir, &device, greedy_bleu(&device))?;
    run(trainer.with_precision(precision), collective, choice)
}

/// Trains as one rank of `collective`: rank 0 reports and evaluates the test set; the other ranks train silently.
fn run(trainer: TranslationTrainer, collective: Rc<dyn Collective>, choice: DeviceChoice) -> Result<()> {
    let mut trainer = trainer.with_collective(collective.clone());
    if collective.rank() > 0 {
        trainer.run(&mut ())?;
        crate::ranks::report_end(&*collective, trainer.step, trainer.fingerprint());
        return Ok(());
    }
    // The test set is read before training, so a bad path fails now rather than after the last step.
    let test = trainer.task.config.data.test.as_ref().map(|path| read_tsv(path)).transpose()?;
    let task = &trainer.task;
    let vocabularies = match task.vocab.sizes() {
        (joint, _) if task.vocab.joint => format!("joint vocabulary {joint}"),
        (source, target) => format!("vocabularies {source} (source) and {target} (target)"),
    };
    println!(
        "{} training pairs ({} longer than {} tokens left out), {} validation pairs, {vocabularies}; {}",
        task.train.len(),
        task.dropped,
        task.config.data.max_len,
        task.valid.len(),
        crate::progress::step_range(trainer.step, trainer.config.max_steps),
    );
    let mut progress = Progress::new(trainer.step, trainer.config.max_steps);
    let result = trainer.run(&mut progress);
    progress.finish();
    result?;
    crate::ranks::report_end(&*collective, trainer.step, trainer.fingerprint());
    println!("run directory: {}", trainer.run_dir.display());
    if let Some(pairs) = test {
        let (device, _) = devices::select(choice)?;
        score(&translation::load(&trainer.run_dir, None, &device)?, &pairs, None, None, &device)?;
    }
    Ok(())
}
