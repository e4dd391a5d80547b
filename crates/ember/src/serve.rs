//! `ember serve`: listen at once (answering 503 while the model loads), load the model, and run the continuous-batching
//! scheduler on this thread until SIGINT or SIGTERM, which stop accepting, close idle connections and let every
//! request in flight finish.

use std::net::TcpListener;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::mpsc;
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use clap::Args;
use ember_core_model::files;
use ember_formats::chat::{ChatFormat, ChatTemplate};
use ember_serve::http::{self, Limits};
use ember_serve::metrics::Metrics;
use ember_serve::scheduler::{self, Batching};
use ember_serve::server::{self, App, ChatPrompt, Options, Served};
use tokio::signal::unix::{SignalKind, signal};

use crate::devices::DeviceChoice;
use crate::inference::{HoldFlags, KvFlags, Placement, load_for_inference};

#[derive(Args)]
pub struct ServeArgs {
    /// A run directory, Hugging Face directory or GGUF file.
    #[arg(long)]
    model: PathBuf,
    #[command(flatten)]
    hold: HoldFlags,
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// 0 picks a free port (printed at start).
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// The model's id in the API; the file or directory name when absent.
    #[arg(long)]
    name: Option<String>,
    /// Sequences decoded together.
    #[arg(long, default_value_t = 16)]
    max_batch: usize,
    /// Sequences that may wait for a place in the batch; requests beyond get 429 at once (default: 4 batches).
    #[arg(long)]
    max_queue: Option<usize>,
    /// Seconds a generation may take from its request's arrival; then it ends with 504 (or an error event when
    /// streaming) and its sequences are freed.
    #[arg(long, default_value_t = 600.0)]
    request_timeout: f64,
    /// Seconds for a request's headers to arrive, counted from the connection's start or its last response: a
    /// connection that idles or trickles longer is closed.
    #[arg(long, default_value_t = 10.0)]
    header_timeout: f64,
    #[command(flatten)]
    kv: KvFlags,
    /// With `--kv-cache paged`: full prompt pages kept for later requests that start with the same tokens (prefix
    /// caching; 0 turns it off).
    #[arg(long, default_value_t = 256)]
    prefix_cache_pages: usize,
    /// A Jinja chat template for /v1/chat/completions, in place of the model's own (a GGUF file's
    /// tokenizer.chat_template, a Hugging Face directory's chat_template.jinja or tokenizer_config.json).
    #[arg(long)]
    chat_template: Option<PathBuf>,
    /// Require this key of every route but / and /health (`Authorization: Bearer KEY` or `X-Api-Key: KEY`).
    #[arg(long, conflicts_with = "api_key_file")]
    api_key: Option<String>,
    /// Read the key from the first line of this file (keeps it out of the process list).
    #[arg(long)]
    api_key_file: Option<PathBuf>,
    /// Let browser pages from this origin call the API (repeatable; `*` for any). CORS is off without it.
    #[arg(long)]
    cors_origin: Vec<String>,
}

/// Seconds given on the command line as a duration: positive and finite.
fn seconds(flag: &str, value: f64) -> Result<Duration> {
    Duration::try_from_secs_f64(value)
        .ok()
        .filter(|d| !d.is_zero())
        .ok_or_else(|| anyhow!("{flag} must be a positive number of seconds, not {value}"))
}

/// Resolves on SIGINT or SIGTERM.
async fn stop_signal() {
    let (Ok(mut interrupt), Ok(mut terminate)) = (signal(SignalKind::interrupt()), signal(SignalKind::terminate()))
    else {
        return std::future::pending().await;
    };
    tokio::select! {
        _ = interrupt.recv() => {}
        _ = terminate.recv() => {}
    }
}

pub fn serve(args: ServeArgs, choice: DeviceChoice) -> Result<()> {
    if args.max_batch == 0 {
        bail!("--max-batch must be at least 1");
    }
    let deadline = seconds("--request-timeout", args.request_timeout)?;
    let header_timeout = seconds("--header-timeout", args.header_timeout)?;
    let id = args
        .name
        .clone()
        .unwrap_or_else(|| args.model.file_stem().map_or("model".into(), |s| s.to_string_lossy().into_owned()));
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
    let defaults = Options::new(args.max_batch);
    let options = Options {
        api_key,
        cors_origins: args.cors_origin.clone(),
        max_queue: args.max_queue.unwrap_or(defaults.max_queue),
        deadline,
        ..defaults
    };
    let listener = TcpListener::bind((args.host.as_str(), args.port))
        .with_context(|| format!("cannot listen on {}:{}", args.host, args.port))?;
    let address = listener.local_addr()?;
    let (jobs, received) = mpsc::channel();
    let metrics = Arc::new(Metrics::default());
    let app = App::new(id.clone(), jobs, metrics.clone(), options);
    let router = server::router(app.clone()).map_err(|e| anyhow!("{e} is not a valid origin"))?;
    let limits = Limits { header_timeout, ..Limits::default() };
    let listening = http::spawn(listener, router, limits, stop_signal())?;
    println!("listening on http://{address}; loading {}", args.model.display());

    let placement = Placement::new(choice, args.hold.dtype)?;
    let run = load_for_inference(&args.model, args.hold, &placement, args.max_batch)?;
    let kv = args.kv.spec(run.model.config())?;
    let chat = chat_prompt(args.chat_template.as_deref(), &run.chat)?;
    let chat_note = if chat.is_some() { "completions and chat completions" } else { "completions (no chat template)" };
    app.ready(Served { chat, tokenizer: run.tokenizer.clone(), context: run.model.block_size() });
    // The scheduler ends when the server, which holds the last job sender, has shut down.
    drop(app);
    let (description, precision) = (&placement.description, placement.precision);
    println!("serving {id} ({description}, {precision}), {chat_note}; Ctrl-C or SIGTERM drains and stops");
    std::io::Write::flush(&mut std::io::stdout())?;
    let batching = Batching { max_batch: args.max_batch, kv, prefix_pages: args.prefix_cache_pages };
    scheduler::run(&run.model, &run.tokenizer, &placement.device, batching, received, &metrics);
    listening.join().map_err(|_| anyhow!("the HTTP thread panicked"))??;
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
