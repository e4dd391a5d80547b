//! `ember serve`: load a model, listen, and run the continuous-batching scheduler until Ctrl-C, which stops accepting
//! and lets every request in flight finish.

use std::net::TcpListener;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::thread;

use anyhow::{Context, Result, anyhow, bail};
use clap::Args;
use ember_core_model::files;
use ember_core_model::import;
use ember_formats::chat::{ChatFormat, ChatTemplate};
use ember_serve::metrics::Metrics;
use ember_serve::server::{ChatPrompt, Served};
use ember_serve::{KvKind, KvSpec, scheduler, server};

use crate::devices::{self, DeviceChoice};

#[derive(Args)]
pub struct ServeArgs {
    /// A run directory, Hugging Face directory or GGUF file.
    #[arg(long)]
    model: PathBuf,
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// 0 picks a free port (printed at start).
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// The model's id in the API; the file or directory name when absent.
    #[arg(long)]
    name: Option<String>,
    /// Sequences decoded together; more requests wait their turn.
    #[arg(long, default_value_t = 16)]
    max_batch: usize,
    #[arg(long, default_value = "contiguous")]
    kv_cache: KvKind,
    #[arg(long, default_value_t = 16)]
    page_size: usize,
    #[arg(long, default_value_t = 32)]
    kv_group: usize,
    /// A Jinja chat template for /v1/chat/completions, in place of the model's own (a GGUF file's
    /// tokenizer.chat_template, a Hugging Face directory's chat_template.jinja or tokenizer_config.json).
    #[arg(long)]
    chat_template: Option<PathBuf>,
    /// Require this key of every request but /health (`Authorization: Bearer KEY` or `X-Api-Key: KEY`).
    #[arg(long, conflicts_with = "api_key_file")]
    api_key: Option<String>,
    /// Read the key from the first line of this file (keeps it out of the process list).
    #[arg(long)]
    api_key_file: Option<PathBuf>,
}

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
}

pub fn serve(args: ServeArgs, choice: DeviceChoice) -> Result<()> {
    if args.max_batch == 0 {
        bail!("--max-batch must be at least 1");
    }
    let (device, description) = devices::select(choice)?;
    let run = import::load(&args.model, &device)?;
    if devices::on_host(choice) {
        crate::admission::admit_kv_stores(&run.config, args.max_batch)?;
    }
    let kv = KvSpec { kind: args.kv_cache, page_size: args.page_size, group: args.kv_group };
    kv.check(run.model.block_size()).map_err(anyhow::Error::msg)?;
    let id = args
        .name
        .clone()
        .unwrap_or_else(|| args.model.file_stem().map_or("model".into(), |s| s.to_string_lossy().into_owned()));
    let chat = chat_prompt(args.chat_template.as_deref(), &run.chat)?;
    let api_key = match &args.api_key_file {
        Some(path) => {
            let text = files::read_to_string(path).with_context(|| format!("--api-key-file {}", path.display()))?;
            Some(text.lines().next().unwrap_or_default().trim().to_string())
        }
        None => args.api_key.clone(),
    };
    if api_key.as_deref() == Some("") {
        bail!("the API key is empty");
    }
    let listener = TcpListener::bind((args.host.as_str(), args.port))
        .with_context(|| format!("cannot listen on {}:{}", args.host, args.port))?;
    let address = listener.local_addr()?;
    // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
    unsafe {
        libc::signal(libc::SIGINT, on_signal as *const () as libc::sighandler_t);
        libc::signal(libc::SIGTERM, on_signal as *const () as libc::sighandler_t);
    }
    let chat_note = if chat.is_some() { "completions and chat completions" } else { "completions (no chat template)" };
    println!("serving {id} on http://{address} ({description}), {chat_note}; Ctrl-C drains and stops");
    std::io::Write::flush(&mut std::io::stdout())?;
    let (jobs, received) = mpsc::channel();
    let metrics = Arc::new(Metrics::default());
    let reported = metrics.clone();
    let context = run.model.block_size();
    let served = Arc::new(Served { id, chat, tokenizer: run.tokenizer.clone(), context, api_key });
    let acceptor = thread::spawn(move || server::accept(listener, served, jobs, reported, &STOP));
    scheduler::run(&run.model, &run.tokenizer, kv, &device, args.max_batch, received, &metrics);
    acceptor.join().map_err(|_| anyhow!("the listener thread panicked"))??;
    println!("stopped: every request in flight finished");
    Ok(())
}

/// The chat template of `--chat-template FILE`, else the model's own, compiled now so that a broken template stops
/// the server before it listens.
fn chat_prompt(file: Option<&std::path::Path>, format: &ChatFormat) -> Result<Option<ChatPrompt>> {
    let source = match file {
        Some(path) => Some(files::read_to_string(path).with_context(|| format!("--chat-template {}", path.display()))?),
        None => format.template.clone(),
    };
    let Some(source) = source else { return Ok(None) };
    let template = ChatTemplate::new(source).map_err(|e| anyhow!("{e}"))?;
    Ok(Some(ChatPrompt { template, bos_token: format.bos_token.clone(), eos_token: format.eos_token.clone() }))
}
