//! `ember bench serve`: the HTTP server under concurrent streaming clients, in one process: requests/s, generated
//! tokens/s, time to first token and latency percentiles.

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, mpsc};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Result, anyhow};
use clap::Args;
use ember_core_model::import;
use ember_serve::metrics::Metrics;
use ember_serve::server::Served;
use ember_serve::{KvKind, scheduler, server};
use serde_json::json;

use crate::devices::{self, DeviceChoice};

#[derive(Args)]
pub struct BenchServeArgs {
    /// A run directory, Hugging Face directory or GGUF file.
    #[arg(long)]
    model: PathBuf,
    /// Requests in all.
    #[arg(long, default_value_t = 32)]
    requests: usize,
    /// Clients sending at once (and the scheduler's batch).
    #[arg(long, default_value_t = 16)]
    concurrency: usize,
    /// Tokens generated per request.
    #[arg(long, default_value_t = 64)]
    max_tokens: usize,
    /// The prompt every request sends.
    #[arg(long, default_value = "\n")]
    prompt: String,
}

/// One streamed request: (time to first token, total time, tokens received).
fn stream_one(address: &str, body: &str) -> Result<(Duration, Duration, usize)> {
    let started = Instant::now();
    let mut stream = TcpStream::connect(address)?;
    write!(
        stream,
        "POST /v1/completions HTTP/1.1\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    let (mut first, mut chunks) = (None, 0);
    for line in BufReader::new(stream).lines() {
        let line = line?;
        if line.starts_with("HTTP/1.1") && !line.contains(" 200 ") {
            return Err(anyhow!("the server answered {line}"));
        }
        if let Some(data) = line.strip_prefix("data: ") {
            first.get_or_insert_with(|| started.elapsed());
            if data != "[DONE]" {
                chunks += 1;
            }
        }
    }
    Ok((first.unwrap_or_default(), started.elapsed(), chunks))
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

pub fn bench_serve(args: BenchServeArgs, device: DeviceChoice) -> Result<()> {
    let (device, description) = devices::select(device)?;
    let run = import::load(&args.model, &device)?;
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let address = listener.local_addr()?.to_string();
    let stop = Arc::new(AtomicBool::new(false));
    let metrics = Arc::new(Metrics::default());
    let (jobs, received) = mpsc::channel();
    let served = Served {
        id: "bench".into(),
        chat: None,
        tokenizer: run.tokenizer.clone(),
        context: run.model.block_size(),
        api_key: None,
    };
    let acceptor = {
        let (stop, metrics, served) = (stop.clone(), metrics.clone(), Arc::new(served));
        thread::spawn(move || server::accept(listener, served, jobs, metrics, &stop))
    };
    let body =
        json!({"prompt": args.prompt, "max_tokens": args.max_tokens, "temperature": 0, "stream": true}).to_string();
    let (requests, concurrency) = (args.requests.max(1), args.concurrency.max(1));
    let driver = {
        let stop = stop.clone();
        thread::spawn(move || {
            let started = Instant::now();
            let next = Arc::new(AtomicUsize::new(0));
            let clients: Vec<_> = (0..concurrency)
                .map(|_| {
                    let (next, address, body) = (next.clone(), address.clone(), body.clone());
                    thread::spawn(move || {
                        let mut results = Vec::new();
                        while next.fetch_add(1, Ordering::SeqCst) < requests {
                            results.push(stream_one(&address, &body));
                        }
                        results
                    })
                })
                .collect();
            let results: Vec<_> = clients.into_iter().flat_map(|c| c.join().unwrap_or_default()).collect();
            stop.store(true, Ordering::SeqCst);
            (results, started.elapsed())
        })
    };
    let kv = KvKind::Contiguous.into();
    scheduler::run(&run.model, &run.tokenizer, kv, &device, concurrency, received, &metrics);
    acceptor.join().map_err(|_| anyhow!("the listener panicked"))??;
    let (results, wall) = driver.join().map_err(|_| anyhow!("the load generator panicked"))?;
    let results: Vec<_> = results.into_iter().collect::<Result<_>>()?;
    let tokens: usize = results.iter().map(|r| r.2).sum();
    let mut first: Vec<f64> = results.iter().map(|r| r.0.as_secs_f64()).collect();
    let mut total: Vec<f64> = results.iter().map(|r| r.1.as_secs_f64()).collect();
    first.sort_by(f64::total_cmp);
    total.sort_by(f64::total_cmp);
    let wall = wall.as_secs_f64();
    println!(
        "bench serve: {} on {description}: {requests} streaming requests of {} tokens, {concurrency} at a time",
        args.model.display(),
        args.max_tokens
    );
    println!("| requests/s | generated tokens/s | first token p50 / p99 | latency p50 / p99 |");
    println!("|---|---|---|---|");
    println!(
        "| {:.2} | {:.1} | {:.2} s / {:.2} s | {:.2} s / {:.2} s |",
        requests as f64 / wall,
        tokens as f64 / wall,
        percentile(&first, 0.5),
        percentile(&first, 0.99),
        percentile(&total, 0.5),
        percentile(&total, 0.99)
    );
    Ok(())
}
