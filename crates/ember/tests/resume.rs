//! Resume is exact, a process killed while checkpointing leaves a loadable checkpoint, and a run's memory does not
//! grow with its corpus.

mod common;

use std::process::Command;
use std::time::Duration;

use common::*;

#[test]
fn forty_steps_equal_twenty_then_resume_twenty() {
    let dir = tempfile::tempdir().unwrap();
    let corpus = small_corpus(dir.path(), 100_000);
    let straight = dir.path().join("straight");
    let config = tiny_config(dir.path(), &corpus, &straight, "");
    train_ok(&["--device", "cpu", "--config", config.to_str().unwrap()]);

    let split = dir.path().join("split");
    let config = tiny_config(dir.path(), &corpus, &split, "");
    train_ok(&["--device", "cpu", "--config", config.to_str().unwrap(), "--set", "train.max_steps=20"]);
    train_ok(&["--device", "cpu", "--resume", split.to_str().unwrap(), "--set", "train.max_steps=40"]);

    let (a, b) = (step_losses(&straight), step_losses(&split));
    assert_eq!(a.len(), 40);
    assert_eq!(a.iter().map(|s| s.0).collect::<Vec<_>>(), b.iter().map(|s| s.0).collect::<Vec<_>>());
    for ((step, x), (_, y)) in a.iter().zip(&b) {
        assert!((x - y).abs() <= 1e-6, "step {step}: straight {x} vs resumed {y}");
    }
    assert!(a[39].1 < a[0].1, "training lowers the loss");
}

#[test]
fn killing_training_mid_checkpoint_leaves_the_previous_checkpoint_loadable() {
    let tiny = Tiny::new(100_000, "checkpoint_interval = 1\n");
    let (run, config) = (&tiny.run, tiny.config());
    let ckpt = run.join("checkpoint.safetensors");
    // Kill at staggered moments while a checkpoint is written every step, then resume each time.
    for (i, delay_ms) in [0u64, 7, 13, 29, 41].into_iter().enumerate() {
        let mut args: Vec<String> = vec!["train".into(), "--device".into(), "cpu".into(), "--no-sample".into()];
        if i == 0 {
            args.extend(["--config".into(), config.into(), "--set".into(), "train.max_steps=100000".into()]);
        } else {
            args.extend(["--resume".into(), run.to_str().unwrap().into()]);
        }
        let mut child = Command::new(env!("CARGO_BIN_EXE_ember"))
            .env("EMBER_CACHE_DIR", test_cache())
            .args(&args)
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let before = std::fs::metadata(&ckpt).and_then(|m| m.modified()).ok();
        while std::fs::metadata(&ckpt).and_then(|m| m.modified()).ok() == before {
            assert!(child.try_wait().unwrap().is_none(), "training exited before writing a checkpoint");
            std::thread::sleep(Duration::from_millis(1));
        }
        std::thread::sleep(Duration::from_millis(delay_ms));
        child.kill().unwrap();
        child.wait().unwrap();
        let out = ember(&["generate", "--device", "cpu", "--model", run.to_str().unwrap(), "--max-new-tokens", "2"]);
        assert!(out.status.success(), "after kill {i}: {}", String::from_utf8_lossy(&out.stderr));
    }
    // max_steps below the checkpoint's step: nothing to train, but the checkpoint must load, and the run says so.
    let out = train_ok(&["--device", "cpu", "--resume", run.to_str().unwrap(), "--set", "train.max_steps=1"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("of train.max_steps = 1: nothing to train"), "{stdout}");
}

/// Named tensors, as a checkpoint holds them.
type Named = Vec<(String, burn::tensor::TensorData)>;

/// A run whose checkpoint or token cache was damaged after it was written: resuming stops with an error naming
/// the damage instead of panicking (a short or missing AdamW moment, a token id past the vocabulary).
#[test]
fn a_damaged_checkpoint_or_token_cache_is_refused_on_resume() {
    use ember_core_model::bundle;
    let dir = tempfile::tempdir().unwrap();
    let run = tiny_run(dir.path(), 4);
    let resume = || ember(&["train", "--device", "cpu", "--no-sample", "--resume", run.to_str().unwrap()]);
    let ckpt = run.join(bundle::CHECKPOINT);
    let original = std::fs::read(&ckpt).unwrap();
    let (tensors, metadata) = bundle::load_tensors(&ckpt).unwrap();
    let rewrite = |edit: &dyn Fn(&mut Named)| {
        let mut all: Vec<_> = tensors.clone().into_iter().collect();
        edit(&mut all);
        bundle::save_tensors(&ckpt, &all, metadata.clone()).unwrap();
    };
    let moment = "optim.m.wte.weight";
    assert!(tensors.contains_key(moment), "{:?}", tensors.keys().collect::<Vec<_>>());

    rewrite(&|all| {
        let (_, data) = all.iter_mut().find(|(k, _)| k == moment).unwrap();
        *data = burn::tensor::TensorData::new(vec![0f32; 5], [5]);
    });
    assert_clean_error(&resume(), "AdamW moment m.wte.weight is [5] F32");

    rewrite(&|all| all.retain(|(k, _)| k != moment));
    assert_clean_error(&resume(), "it has no AdamW moments for wte.weight after 4 updates");

    std::fs::write(&ckpt, original).unwrap();
    let train_bin = run.join("train.bin");
    let mut ids = std::fs::read(&train_bin).unwrap();
    ids[40..44].copy_from_slice(&u32::MAX.to_le_bytes());
    std::fs::write(&train_bin, ids).unwrap();
    assert_clean_error(&resume(), "train.bin is corrupt: token 10 is id 4294967295, past the tokenizer's vocabulary");
}

/// What a trainer killed mid-write leaves behind: unfinished `.tmp` files, which the next trainer on the directory
/// removes, and, killed between the two files of a checkpoint, a checkpoint without its model file, which resumes.
#[test]
fn unfinished_files_are_removed_and_a_checkpoint_without_its_model_file_resumes() {
    let dir = tempfile::tempdir().unwrap();
    let run = tiny_run(dir.path(), 4);
    std::fs::remove_file(run.join("model.safetensors")).unwrap();
    for leftover in ["model.tmp", "checkpoint.tmp", "metrics.tmp"] {
        std::fs::write(run.join(leftover), b"half a file").unwrap();
    }
    train_ok(&["--device", "cpu", "--resume", run.to_str().unwrap(), "--set", "train.max_steps=6"]);
    assert!(run.join("model.safetensors").is_file());
    let left: Vec<_> = std::fs::read_dir(&run)
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|name| name.ends_with(".tmp"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
    assert_eq!(step_losses(&run).last().unwrap().0, 6);
}

/// The corpus is tokenized chunk by chunk into token files that training reads a window at a time: a run on 40 MB of
/// text trains under a 400 MiB limit on its address space (`ulimit -v`; holding the text and its tokenizer records
/// whole took 169 bytes per byte of corpus, 6.8 GB), and its peak memory stays within 64 MiB of a run on 4 MB.
#[test]
fn training_memory_does_not_grow_with_the_corpus() {
    let dir = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(small_corpus(dir.path(), 100_000)).unwrap();
    let peak_kib = |copies: usize, limit: &str| {
        let corpus = dir.path().join(format!("corpus-{copies}.txt"));
        std::fs::write(&corpus, text.repeat(copies)).unwrap();
        let config = tiny_config(dir.path(), &corpus, &dir.path().join(format!("run-{copies}")), "");
        let log = dir.path().join(format!("train-{copies}.log"));
        let child = Command::new("sh")
            .env("EMBER_CACHE_DIR", test_cache())
            .args(["-c", &format!("ulimit -v {limit} && exec \"$0\" \"$@\""), env!("CARGO_BIN_EXE_ember")])
            .args(["train", "--device", "cpu", "--no-sample", "--config", config.to_str().unwrap()])
            .args(["--set", "train.max_steps=2"])
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let (status, peak) = peak_resident_kib(child);
        assert!(status, "{copies} copies under ulimit -v {limit}: {}", std::fs::read_to_string(&log).unwrap());
        peak
    };
    let (small, large) = (peak_kib(40, "unlimited"), peak_kib(400, "409600"));
    assert!(large < small + 64 * 1024, "peak {small} KiB on 4 MB of text, {large} KiB on 40 MB");
}

/// Waits for `child`: whether it succeeded, and its peak resident memory in KiB.
fn peak_resident_kib(child: std::process::Child) -> (bool, i64) {
    let mut status = 0;
    // SAFETY: rusage is plain integers, for which all zeros is a value; wait4 writes the child's exit status and
    // resource usage into the two locals it is given and reads nothing else.
    let (pid, usage) = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        (libc::wait4(child.id() as libc::pid_t, &mut status, 0, &mut usage), usage)
    };
    assert_eq!(pid, child.id() as libc::pid_t, "waiting for the trainer");
    (libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, usage.ru_maxrss)
}
