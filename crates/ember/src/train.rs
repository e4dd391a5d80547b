//! `ember train`: config → data (prepared when missing) → tokenizer → Trainer → run directory → a sample.

use std::path::PathBuf;
use std::rc::Rc;

use anyhow::{Result, bail};
use burn::module::Module;
use clap::Args;
use ember_core_model::bundle;
use ember_core_model::config::Precision;
use ember_core_model::tokenizer;
use ember_formats::chat::{ChatFormat, ChatTemplate, Json, RenderContext};
use ember_serve::KvKind;
use ember_train::collective::Collective;
use ember_train::config::DataFormat;
use ember_train::lm::Data;
use ember_train::token_cache::TokenCache;
use ember_train::{Trainer, config::KNOWN_DATASETS};
use ember_train::{chats, corpus};

use crate::config::{AnyRunConfig, RunConfig};
use crate::devices::{self, DeviceChoice};
use crate::generate::print_sample;
use crate::progress::Progress;
use crate::ranks;
use crate::run_dir;

#[derive(Args)]
pub struct TrainArgs {
    /// The run config (TOML).
    #[arg(long, required_unless_present = "resume", conflicts_with = "resume")]
    config: Option<PathBuf>,
    /// Continue the run in this directory from its checkpoint (its config.toml is the config); a run directory with
    /// weights but no checkpoint (`ember convert` wrote it) starts from those weights at step 0.
    #[arg(long)]
    resume: Option<PathBuf>,
    /// Override a config value, e.g. --set train.max_steps=100 (repeatable).
    #[arg(long = "set", value_name = "SECTION.KEY=VALUE")]
    overrides: Vec<String>,
    /// Skip the sample printed after training.
    #[arg(long)]
    no_sample: bool,
    /// Start a new run even where train.out_dir holds a model or a checkpoint, replacing them.
    #[arg(long, conflicts_with = "resume")]
    force: bool,
}

/// Trains alone, or as one rank of `collective`: rank 0 prepares and writes the run directory, the other ranks read
/// what it wrote (so the directory must be one every rank sees) and write nothing.
pub fn train(args: TrainArgs, device: DeviceChoice, collective: Rc<dyn Collective>) -> Result<()> {
    let result = train_rank(args, device, collective.clone());
    ranks::end_all_on_error(result, &*collective)
}

fn train_rank(args: TrainArgs, device_choice: DeviceChoice, collective: Rc<dyn Collective>) -> Result<()> {
    let (config_path, run_dir) = match (&args.config, &args.resume) {
        (_, Some(run_dir)) => {
            if let Some(data) = args.overrides.iter().find(|o| o.trim_start().starts_with("data.")) {
                bail!(
                    "--set {data}: a resumed run keeps the data it was trained on (its tokens are stored in {}); \
                     start a new run to change it",
                    run_dir.display()
                );
            }
            if !run_dir.join(bundle::CHECKPOINT).exists() && !run_dir.join(bundle::MODEL).exists() {
                bail!(
                    "{} has no checkpoint or weights to resume from (expected {} or {})",
                    run_dir.display(),
                    bundle::CHECKPOINT,
                    bundle::MODEL
                );
            }
            (run_dir.join(bundle::CONFIG), Some(run_dir.clone()))
        }
        (Some(path), None) => (path.clone(), None),
        (None, None) => bail!("give --config FILE or --resume RUN_DIR"),
    };
    let mut config = match (AnyRunConfig::load(&config_path, &args.overrides)?, &run_dir) {
        (AnyRunConfig::LanguageModel(config), _) => config,
        (AnyRunConfig::Translation(config), Some(run_dir)) => {
            return crate::translate::resume(run_dir, config, device_choice, collective);
        }
        (AnyRunConfig::Translation(config), None) => {
            return crate::translate::train(&config_path, config, args.force, device_choice, collective);
        }
    };
    let run_dir = run_dir.unwrap_or_else(|| config.train.out_dir.clone());
    let (rank, ranks) = (collective.rank(), collective.ranks());
    let writes = rank == 0;
    let _lock = run_dir::lock_on_rank_0(&run_dir, rank)?;
    if args.resume.is_none() && writes {
        run_dir::check_new(&run_dir, args.force)?;
    }
    let (device, description, precision) =
        devices::select_local_in(device_choice, collective.local_rank(), config.model.dtype)?;
    ranks::announce(&*collective, &description);

    let chat = config.data.format == DataFormat::Chat;
    if chat && args.resume.is_none() {
        bail!(
            "{}: data.format = \"chat\" fine-tunes a model that has a chat template: write its run directory with \
             `ember import MODEL --out RUN --config {0}`, then run `ember train --resume RUN`",
            config_path.display()
        );
    }
    if args.resume.is_none() {
        ensure_corpus(&config)?;
    }
    let seq_len = config.train.seq_len(&config.model);
    let (tok, data): (_, Data) = match writes {
        _ if chat => {
            let tok = tokenizer::load(&run_dir.join(bundle::TOKENIZER))?;
            let format = ChatFormat::from_hf_dir(&run_dir).map_err(|e| anyhow::anyhow!(e))?;
            let chats = chats::read(&config.data.corpus, &tok, &format, config.data.val_fraction, seq_len)?;
            if writes {
                let learned: usize = chats.train.iter().map(|e| e.learned.iter().filter(|&&l| l).count()).sum();
                println!(
                    "{} conversations ({} held out), {learned} assistant tokens to learn",
                    chats.train.len() + chats.val.len(),
                    chats.val.len()
                );
            }
            (tok, Data::Chat(chats))
        }
        true => {
            let bar = crate::progress::tokenizing(&config.data.corpus);
            let mut shown = |done, _| bar.set_position(done);
            let cache = token_cache();
            let resume = args.resume.is_some();
            let prepared = corpus::prepare_reporting(&config.data, &run_dir, resume, cache.as_ref(), &mut shown);
            bar.finish_and_clear();
            let (tok, corpus) = prepared?;
            (tok, Data::Text(corpus))
        }
        false => {
            collective.barrier(); // rank 0 has written the tokenizer and the token splits
            let (tok, corpus) = corpus::load(&run_dir).map_err(|e| {
                anyhow::anyhow!("{e} (every rank reads the run directory rank 0 writes: put it where all can see it)")
            })?;
            (tok, Data::Text(corpus))
        }
    };
    if writes && !chat {
        collective.barrier();
    }
    let vocab = tokenizer::vocab_size(&tok);
    if let Data::Text(corpus) = &data {
        corpus.check_ids(vocab, &run_dir)?;
    }
    // A larger model vocabulary leaves rows unused (nanoGPT pads GPT-2's 50257 to 50304); a smaller one cannot work.
    match config.model.vocab_size {
        Some(v) if v < vocab => {
            bail!("{}: model.vocab_size = {v}: the tokenizer has {vocab} tokens", config_path.display())
        }
        Some(_) => {}
        None => config.model.vocab_size = Some(vocab),
    }
    if let Data::Text(corpus) = &data {
        corpus.check_fits(&config.data.corpus, seq_len)?;
    }
    if devices::on_host(device_choice) {
        crate::admission::admit_training(&config.model, config.train.batch_size(), seq_len)?;
    }
    // A chat model's sample is its reply to the prompt as a user's message.
    if chat {
        let format = ChatFormat::from_hf_dir(&run_dir).map_err(|e| anyhow::anyhow!(e))?;
        let template = ChatTemplate::new(format.template.unwrap_or_default())?;
        let messages = Json::List(vec![Json::Map(vec![
            ("role".into(), Json::Str("user".into())),
            ("content".into(), Json::Str(config.sample.prompt.clone())),
        ])]);
        let context = RenderContext {
            bos_token: &format.bos_token,
            eos_token: &format.eos_token,
            add_generation_prompt: true,
            now: Default::default(),
            tools: None,
        };
        config.sample.prompt = template.render(&messages, &context)?;
    }
    // The sample printed after training, checked before the first step rather than after the last.
    if !args.no_sample {
        ember_serve::prompt_ids(&tok, &config.sample.prompt, config.model.block_size, config.model.vocab())
            .map_err(|e| anyhow::anyhow!("{}: [sample] {e}", config_path.display()))?;
    }
    if args.resume.is_none() && writes {
        bundle::write_atomic(&run_dir.join(bundle::CONFIG), config.to_toml().as_bytes())?;
    }
    // Each rank its own dropout masks; the weights are initialised from train.seed alone, so they agree.
    device.seed(config.train.seed.wrapping_add(rank as u64));
    let trainer = match &args.resume {
        Some(dir) if dir.join(bundle::CHECKPOINT).exists() => {
            Trainer::resume(config.model.clone(), config.train.clone(), data, dir, &device)?
        }
        Some(dir) => {
            let (weights, _) = bundle::load_tensors(&dir.join(bundle::MODEL))?;
            Trainer::new(config.model.clone(), config.train.clone(), data, dir, &device).with_weights(&weights)?
        }
        None => Trainer::new(config.model.clone(), config.train.clone(), data, &run_dir, &device),
    };
    let mut trainer = trainer.with_collective(collective.clone()).with_precision(precision);
    let params = ember_core_model::params::param_infos(&trainer.model)
        .iter()
        .map(|p| p.shape.iter().product::<usize>())
        .sum::<usize>();
    let parallel = match ranks {
        1 => String::new(),
        _ => format!(" ({ranks} ranks × batch {})", config.train.batch_size()),
    };
    if writes {
        println!(
            "training {} parameters in {} on {description}: {} tokens/step{parallel}, {}, run directory {}",
            params,
            match precision {
                Precision::F32 => "f32",
                Precision::F16 => "f16 (f32 master weights, dynamic loss scale)",
            },
            trainer.tokens_per_step(),
            crate::progress::step_range(trainer.step, config.train.max_steps),
            run_dir.display()
        );
    }
    let started = std::time::Instant::now();
    let last = match writes {
        true => {
            let mut progress = Progress::new(trainer.step, config.train.max_steps);
            let last = trainer.run(&mut progress);
            progress.finish();
            last?
        }
        false => trainer.run(&mut ())?,
    };
    ranks::report_end(&*collective, trainer.step, trainer.fingerprint());
    if !writes {
        return Ok(());
    }
    let secs = started.elapsed().as_secs_f64();
    println!(
        "done in {secs:.1} s: train loss {:.4}, val loss {:.4}; wrote {} and {}",
        last.train_loss,
        last.val_loss,
        run_dir.join(bundle::MODEL).display(),
        run_dir.join(bundle::LOSS_PLOT).display()
    );
    if !args.no_sample {
        let inner = device.clone();
        let model = trainer.model.valid();
        print_sample(&model, &tok, &config.sample, KvKind::for_model(model.config()).into(), &inner, 0)?;
    }
    Ok(())
}

/// A missing corpus of a known dataset is an error that names the step which builds it (nothing is downloaded here).
fn ensure_corpus(config: &RunConfig) -> Result<()> {
    let corpus = &config.data.corpus;
    match config.data.dataset.as_deref().filter(|d| KNOWN_DATASETS.contains(d)) {
        Some(dataset) if !corpus.exists() => bail!(
            "{} is missing: build it with `scripts/prepare-data.sh {dataset}` from the Ember repository \
             (EMBER_DATA_DIR chooses where it writes)",
            corpus.display()
        ),
        _ => Ok(()), // corpus::prepare names any other missing file
    }
}

/// Where tokenized corpora are kept between runs: `$EMBER_CACHE_DIR/tokens`, else `$XDG_CACHE_HOME/ember/tokens`,
/// else `~/.cache/ember/tokens` (none without a home).
fn token_cache() -> Option<TokenCache> {
    let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty()).map(PathBuf::from);
    let dir = var("EMBER_CACHE_DIR")
        .or_else(|| var("XDG_CACHE_HOME").map(|d| d.join("ember")))
        .or_else(|| var("HOME").map(|d| d.join(".cache/ember")))?;
    Some(TokenCache::new(dir.join("tokens")))
}
