//! Data-parallel training over MPI end to end (`mpiexec` from MPICH, two ranks on loopback, one thread each): two
//! ranks at a per-rank batch of 6 train exactly as one process at 12 (the baby GPT's shape, with and without gradient
//! accumulation, and the translator), replicas stay bit-identical, a resumed run continues with the same losses, a
//! different world size is refused, and a killed rank ends the other with an error naming it.
//!
//! Tolerances: per-step losses and final weights within 1e-5 of the one-process run (the ranks sum their shards'
//! gradients in a different order than one batch does); the two replicas' weights are compared bit for bit.

#![cfg(feature = "mpi")]

mod common;

use std::io::Read;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::*;
use ember_core_model::bundle;

const EMBER: &str = env!("CARGO_BIN_EXE_ember");

/// `mpiexec [launcher args] -n 2 ember ARGS`, one thread per rank.
fn mpiexec(launcher: &[&str], args: &[&str]) -> Command {
    let mut command = Command::new("mpiexec");
    command.args(launcher).args(["-n", "2", EMBER]).args(args).env("RAYON_NUM_THREADS", "1");
    command
}

fn run_ok(mut command: Command) -> Output {
    let out = command.output().expect("mpiexec runs (scripts/test.sh installs MPICH)");
    assert!(out.status.success(), "{}\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    out
}

/// The baby GPT (configs/shakespeare-char.toml) on the first 100 kB of Shakespeare, for `steps` steps.
fn baby_gpt(dir: &Path, out: &Path, batch: usize, accum: usize, steps: u64) -> Vec<String> {
    let corpus = small_corpus(dir, 100_000);
    let config = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../configs/shakespeare-char.toml");
    [
        "--device".into(),
        "cpu".into(),
        "train".into(),
        "--no-sample".into(),
        "--config".into(),
        config.display().to_string(),
        format!("--set=data.corpus={}", corpus.display()),
        format!("--set=train.out_dir={}", out.display()),
        format!("--set=train.batch_size={batch}"),
        format!("--set=train.grad_accum={accum}"),
        format!("--set=train.max_steps={steps}"),
        "--set=train.eval_interval=10".into(),
        "--set=train.eval_iters=2".into(),
    ]
    .to_vec()
}

fn strs(args: &[String]) -> Vec<&str> {
    args.iter().map(String::as_str).collect()
}

/// The "rank R of N: step S, parameters FINGERPRINT" lines, by rank.
fn fingerprints(out: &Output) -> Vec<String> {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let mut lines: Vec<&str> = stdout.lines().filter(|l| l.contains(", parameters ")).collect();
    lines.sort();
    lines.iter().map(|l| l.split(", parameters ").nth(1).unwrap().to_string()).collect()
}

/// Two ranks (`out`, writing `ranks`) ended with equal replicas, and one process (`single`, writing `alone`) trained
/// the same `steps` with the same losses to the same weights.
fn assert_ranks_match_one_process(out: &Output, single: &Output, (ranks, alone): (&Path, &Path), steps: usize) {
    let prints = fingerprints(out);
    assert!(prints.len() == 2 && prints[0] == prints[1], "the replicas differ: {prints:?}");
    assert!(single.status.success(), "{}", String::from_utf8_lossy(&single.stderr));
    assert_eq!(step_losses(ranks).len(), steps);
    assert_same_losses(ranks, alone);
    assert_same_weights(ranks, alone);
}

fn assert_same_losses(a: &Path, b: &Path) {
    let (a, b) = (step_losses(a), step_losses(b));
    assert_eq!(a.len(), b.len());
    for ((step, x), (_, y)) in a.iter().zip(&b) {
        assert!((x - y).abs() < 1e-5, "step {step}: {x} vs {y}");
    }
}

fn assert_same_weights(a: &Path, b: &Path) {
    let (a, _) = bundle::load_tensors(&a.join(bundle::MODEL)).unwrap();
    let (b, _) = bundle::load_tensors(&b.join(bundle::MODEL)).unwrap();
    assert_eq!(a.len(), b.len());
    for (name, x) in &a {
        let (x, y) = (x.try_to_vec::<f32>().unwrap(), b[name].try_to_vec::<f32>().unwrap());
        let diff = ember_test_support::max_abs_diff(&x, &y);
        assert!(diff < 1e-5, "{name} differs by {diff}");
    }
}

#[test]
fn two_ranks_train_as_one_process_with_twice_the_batch() {
    for accum in [1, 2] {
        let dir = tempfile::tempdir().unwrap();
        let (ranks, alone) = (dir.path().join("ranks"), dir.path().join("alone"));
        let out = run_ok(mpiexec(&[], &strs(&baby_gpt(dir.path(), &ranks, 6, accum, 20))));
        let single = Command::new(EMBER).args(baby_gpt(dir.path(), &alone, 12, accum, 20)).output().unwrap();
        assert_ranks_match_one_process(&out, &single, (&ranks, &alone), 20);
    }
}

#[test]
fn two_ranks_train_the_translator_as_one_process() {
    let dir = tempfile::tempdir().unwrap();
    let (ranks, alone) = (dir.path().join("ranks"), dir.path().join("alone"));
    let args = |out: &Path, max_tokens: usize| {
        let config = tiny_translation_config(dir.path(), out);
        let set = format!("--set=train.max_tokens={max_tokens}");
        // A small learning rate and ε = 1e-6 keep Adam's first steps well conditioned: where a gradient is near zero
        // (the key biases, whose gradient the softmax cancels exactly) ε = 1e-9 would turn rounding noise into ±lr
        // steps, different in either run.
        let small = ["--set=train.max_steps=3", "--set=train.lr=0.02", "--set=train.eps=1e-6"];
        [&["--device", "cpu", "train", "--config", config.to_str().unwrap(), &set][..], &small[..]]
            .concat()
            .into_iter()
            .map(String::from)
            .collect::<Vec<_>>()
    };
    let out = run_ok(mpiexec(&[], &strs(&args(&ranks, 512))));
    let single = Command::new(EMBER).args(args(&alone, 1024)).output().unwrap();
    assert_ranks_match_one_process(&out, &single, (&ranks, &alone), 3);
}

#[test]
fn a_resumed_run_continues_as_the_uninterrupted_one_on_as_many_ranks() {
    let dir = tempfile::tempdir().unwrap();
    let (straight, split) = (dir.path().join("straight"), dir.path().join("split"));
    run_ok(mpiexec(&[], &strs(&baby_gpt(dir.path(), &straight, 6, 1, 20))));
    run_ok(mpiexec(&[], &strs(&baby_gpt(dir.path(), &split, 6, 1, 10))));
    let resume = ["--device", "cpu", "train", "--no-sample", "--resume", split.to_str().unwrap()];
    let alone = Command::new(EMBER).args(resume).arg("--set=train.max_steps=20").output().unwrap();
    assert_clean_error(&alone, "its checkpoint was trained on 2 rank(s) and this run has 1");
    run_ok(mpiexec(&[], &[&resume[..], &["--set=train.max_steps=20"]].concat()));
    let (a, b) = (step_losses(&straight), step_losses(&split));
    assert_eq!(a, b, "the resumed steps differ from the uninterrupted ones");
}

/// One launch of `args` with rank 1 killed (SIGKILL) once training runs: the launch's exit status, its output, rank
/// 1's pid and the seconds from the kill to the end of the launch.
fn kill_rank_1(dir: &Path, args: &[String]) -> (std::process::ExitStatus, String, i32, f64) {
    let log = dir.join("log.txt");
    let mut launch = mpiexec(&[], &strs(args));
    let file = std::fs::File::create(&log).unwrap();
    let mut child = launch.stdout(file.try_clone().unwrap()).stderr(file).stdin(Stdio::null()).spawn().unwrap();
    let read = || std::fs::read_to_string(&log).unwrap_or_default();
    // Rank 1 announces its pid; rank 0's "step 0" evaluation means training has started.
    let pid = loop {
        let text = read();
        let pid =
            text.lines().find_map(|l| l.strip_prefix("rank 1 of 2: pid ")?.split(',').next()?.parse::<i32>().ok());
        if let (Some(pid), true) = (pid, text.contains("step 0:")) {
            break pid;
        }
        assert!(child.try_wait().unwrap().is_none(), "the launch ended early: {text}");
        std::thread::sleep(Duration::from_millis(100));
    };
    std::thread::sleep(Duration::from_millis(500));
    let killed = Instant::now();
    assert!(Command::new("kill").args(["-9", &pid.to_string()]).status().unwrap().success());
    // Never hang the suite: a launch still running two minutes later is a failure.
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if killed.elapsed() > Duration::from_secs(120) {
            child.kill().unwrap();
            panic!("the surviving rank did not end: {}", read());
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let mut text = String::new();
    std::fs::File::open(&log).unwrap().read_to_string(&mut text).unwrap();
    (status, text, pid, killed.elapsed().as_secs_f64())
}

/// The launcher kills the survivor at once; the rank it shelters is told by SIGTERM and names the lost one first.
/// A launch that does not name it is retried twice, so that one scheduling accident on a loaded machine is told
/// apart from a survivor that never names the lost rank.
#[test]
fn a_killed_rank_ends_the_other_with_an_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let args = baby_gpt(dir.path(), &dir.path().join("run"), 6, 1, 1_000_000);
    let mut silent = Vec::new();
    for attempt in 1..=3 {
        std::fs::remove_dir_all(dir.path().join("run")).ok();
        let (status, text, pid, seconds) = kill_rank_1(dir.path(), &args);
        assert!(!status.success(), "{text}");
        if text.contains(&format!("error: rank 1 (pid {pid} on ")) && text.contains("was lost; rank 0 stops") {
            eprintln!("attempt {attempt}: the surviving rank named rank 1 and ended {seconds:.2} s after the kill");
            return;
        }
        silent.push(text);
    }
    panic!("no launch named the lost rank: {silent:#?}");
}
