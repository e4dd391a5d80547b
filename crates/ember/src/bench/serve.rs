//! `ember bench serve`: the HTTP server (the one `ember serve` runs) under streaming clients at several
//! concurrencies, in one process: requests/s, generated tokens/s, time to first token and time per output token
//! (p50 and p99), errors, and the process' resident memory after every round, so that growth across rounds shows.

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, mpsc};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Result, anyhow, bail};
use clap::Args;
use ember_serve::http::{self, Limits};
use ember_serve::metrics::Metrics;
use ember_serve::scheduler::{self, Batching};
use ember_serve::server::{self, App, Options, Served};
use serde_json::{Value, json};

use super::memory::Memory;
use crate::devices::DeviceChoice;
use crate::inference::{HoldFlags, KvFlags, Placement, load_for_inference};

#[derive(Args)]
pub struct BenchServeArgs {
    /// A run directory, Hugging Face directory or GGUF file.
    #[arg(long)]
    model: PathBuf,
    #[command(flatten)]
    hold: HoldFlags,
    /// Requests per concurrency level and round.
    #[arg(long, default_value_t = 32)]
    requests: usize,
    /// Clients sending at once, one level after another (the largest is the scheduler's batch).
    #[arg(long, value_delimiter = ',', default_value = "1,4,16")]
    concurrency: Vec<usize>,
    /// Times the whole set of levels runs; memory is read after each.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Tokens generated per request.
    #[arg(long, default_value_t = 64)]
    max_tokens: usize,
    /// The prompt every request sends.
    #[arg(long, default_value = "\n")]
    prompt: String,
    #[command(flatten)]
    kv: KvFlags,
    /// With `--kv-cache paged`: full prompt pages kept for later requests (as `ember serve`'s).
    #[arg(long, default_value_t = 256)]
    prefix_cache_pages: usize,
}

/// One streamed request, as its client saw it.
struct Timing {
    first_token: Duration,
    total: Duration,
    tokens: usize,
}

/// One streaming completion over a fresh connection, read up to `[DONE]`: any other ending is an error.
fn stream_one(address: &str, body: &str) -> Result<Timing> {
    let started = Instant::now();
    let mut stream = TcpStream::connect(address)?;
    write!(
        stream,
        "POST /v1/completions HTTP/1.1\r\nHost: {address}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n{body}",
        body.len()
    )?;
    let (mut first, mut tokens, mut done) = (None, None, false);
    let mut lines = BufReader::new(stream).lines();
    let status = lines.next().ok_or_else(|| anyhow!("no response"))??;
    if !status.contains(" 200 ") {
        bail!("the server answered {status}");
    }
    for line in lines {
        // Chunked framing lines (sizes, blank separators) are skipped; events are whole lines.
        let Some(data) = line?.strip_prefix("data: ").map(String::from) else { continue };
        if data == "[DONE]" {
            done = true;
            break;
        }
        let chunk: Value = serde_json::from_str(&data)?;
        if chunk["choices"][0]["text"].as_str().is_some_and(|t| !t.is_empty()) {
            first.get_or_insert_with(|| started.elapsed());
        }
        if let Some(n) = chunk["usage"]["completion_tokens"].as_u64() {
            tokens = Some(n as usize);
        }
    }
    match (done, first, tokens) {
        (true, Some(first_token), Some(tokens)) => Ok(Timing { first_token, total: started.elapsed(), tokens }),
        _ => bail!("the stream ended without text, usage or [DONE]"),
    }
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted.get(((sorted.len().max(1) - 1) as f64 * p).round() as usize).copied().unwrap_or(f64::NAN)
}

/// The results of one concurrency level in one round.
struct Level {
    wall: Duration,
    timings: Vec<Timing>,
    errors: Vec<String>,
}

/// `requests` requests, `concurrency` at a time.
fn run_level(address: &str, body: &str, requests: usize, concurrency: usize) -> Level {
    let started = Instant::now();
    let next = Arc::new(AtomicUsize::new(0));
    let clients: Vec<_> = (0..concurrency)
        .map(|_| {
            let (next, address, body) = (next.clone(), address.to_string(), body.to_string());
            thread::spawn(move || {
                let mut results = Vec::new();
                while next.fetch_add(1, Ordering::SeqCst) < requests {
                    results.push(stream_one(&address, &body));
                }
                results
            })
        })
        .collect();
    let (mut timings, mut errors) = (Vec::new(), Vec::new());
    for result in clients.into_iter().flat_map(|c| c.join().unwrap_or_default()) {
        match result {
            Ok(t) => timings.push(t),
            Err(e) => errors.push(e.to_string()),
        }
    }
    Level { wall: started.elapsed(), timings, errors }
}

pub fn bench_serve(args: BenchServeArgs, choice: DeviceChoice) -> Result<()> {
    if args.concurrency.contains(&0) || args.requests == 0 || args.rounds == 0 || args.max_tokens < 2 {
        bail!("--concurrency levels, --requests and --rounds must be at least 1, --max-tokens at least 2");
    }
    let batch = args.concurrency.iter().copied().max().unwrap_or(1);
    let placement = Placement::new(choice, args.hold.dtype)?;
    let run = load_for_inference(&args.model, args.hold, &placement, batch)?;
    let kv = args.kv.spec(run.model.config())?;
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let address = listener.local_addr()?.to_string();
    let metrics = Arc::new(Metrics::default());
    let (jobs, received) = mpsc::channel();
    let app = App::new("bench".into(), jobs, metrics.clone(), Options::new(batch));
    app.ready(Served { chat: None, tokenizer: run.tokenizer.clone(), context: run.model.block_size() });
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let listening =
        http::spawn(listener, server::router(app).map_err(anyhow::Error::msg)?, Limits::default(), async {
            let _ = stopped.await;
        })?;
    let body = json!({"prompt": args.prompt, "max_tokens": args.max_tokens, "temperature": 0, "stream": true,
                      "stream_options": {"include_usage": true}})
    .to_string();
    let (requests, levels, rounds) = (args.requests, args.concurrency.clone(), args.rounds);
    let before = Memory::now();
    let driver = thread::spawn(move || {
        let mut results = Vec::new();
        for _ in 0..rounds {
            let round: Vec<Level> = levels.iter().map(|&c| run_level(&address, &body, requests, c)).collect();
            results.push((round, Memory::now()));
        }
        let _ = stop.send(());
        results
    });
    let batching = Batching { max_batch: batch, kv, prefix_pages: args.prefix_cache_pages };
    scheduler::run(&run.model, &run.tokenizer, &placement.device, batching, received, &metrics);
    listening.join().map_err(|_| anyhow!("the HTTP thread panicked"))??;
    let results = driver.join().map_err(|_| anyhow!("the load generator panicked"))?;

    println!(
        "bench serve: {} on {}, {}: {requests} streaming requests of {} tokens per level and round, {rounds} \
         rounds, greedy",
        args.model.display(),
        placement.description,
        placement.precision,
        args.max_tokens
    );
    println!(
        "| concurrency | requests/s | generated tokens/s | TTFT p50 / p99 | TPOT p50 / p99 | errors |\n|---:|---:|---:|---:|---:|---:|"
    );
    let mut errors = Vec::new();
    for (i, &concurrency) in args.concurrency.iter().enumerate() {
        let level: Vec<&Level> = results.iter().map(|(round, _)| &round[i]).collect();
        let timings: Vec<&Timing> = level.iter().flat_map(|l| &l.timings).collect();
        let wall: f64 = level.iter().map(|l| l.wall.as_secs_f64()).sum();
        let tokens: usize = timings.iter().map(|t| t.tokens).sum();
        let mut first: Vec<f64> = timings.iter().map(|t| t.first_token.as_secs_f64()).collect();
        let mut per_token: Vec<f64> =
            timings.iter().map(|t| (t.total - t.first_token).as_secs_f64() / (t.tokens.max(2) - 1) as f64).collect();
        first.sort_by(f64::total_cmp);
        per_token.sort_by(f64::total_cmp);
        let failed: Vec<&String> = level.iter().flat_map(|l| &l.errors).collect();
        println!(
            "| {concurrency} | {:.2} | {:.1} | {:.1} ms / {:.1} ms | {:.2} ms / {:.2} ms | {} |",
            timings.len() as f64 / wall,
            tokens as f64 / wall,
            percentile(&first, 0.5) * 1e3,
            percentile(&first, 0.99) * 1e3,
            percentile(&per_token, 0.5) * 1e3,
            percentile(&per_token, 0.99) * 1e3,
            failed.len()
        );
        errors.extend(failed);
    }
    let rss: Vec<String> = results.iter().map(|(_, memory)| format!("{:.0}", memory.resident_mib)).collect();
    let peak = results.last().map_or(f64::NAN, |(_, memory)| memory.peak_mib);
    println!(
        "memory: resident {:.0} MiB before, after each round {} MiB; peak {:.0} MiB before, {peak:.0} MiB at the end",
        before.resident_mib,
        rss.join(" / "),
        before.peak_mib
    );
    let metrics = metrics.render();
    let hit_rate = metrics.lines().find_map(|l| l.strip_prefix("ember_prefix_cache_hit_rate "));
    println!("prefix cache hit rate: {}", hit_rate.unwrap_or("0"));
    if let Some(first) = errors.first() {
        bail!("{} requests failed; the first: {first}", errors.len());
    }
    Ok(())
}
