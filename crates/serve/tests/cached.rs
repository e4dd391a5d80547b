//! Cached decoding equals full recomputation: for 64 steps the next-token logits agree within 1e-5 on the CPU for
//! GPT, Llama (GQA, RoPE), MLA (absorbed, against cached latents) and sliding-window models, with the contiguous and
//! the paged store, and linear-attention models with their recurrent state; quantized stores stay close; forked sequences share pages, and later prompts the cached pages of
//! their shared prefix.

use std::collections::HashMap;

use burn::tensor::{Device, Int, Tensor, TensorData};
use ember_core_model::cache::KvCache;
use ember_core_model::config::{AttentionKernel, AttentionKind};
use ember_core_model::params::{load_state_dict, state_dict};
use ember_core_model::{Build, CausalLm, ModelConfig, Rng};
use ember_serve::kv::{Bits, ContiguousCache, PagePool, PagedCache, QuantizedCache, StateCache};
use ember_serve::sampling::argmax;
use ember_serve::{Decoder, KvKind, KvSpec};
use ember_test_support::max_abs_diff as max_diff;

fn configs() -> Vec<(&'static str, ModelConfig)> {
    let gpt = ModelConfig::gpt(50, 2, 4, 32, 96);
    let llama = gpt.clone().llama_style(2);
    let mla = llama.clone().mla_style(16, 4);
    let window = ModelConfig { window: Some(12), ..llama.clone() };
    let linear = ModelConfig { attention_kernel: AttentionKernel::Linear, ..llama.clone() };
    let favor = ModelConfig { attention_kernel: AttentionKernel::Favor, favor_features: Some(32), ..gpt.clone() };
    vec![
        ("gpt", gpt),
        ("llama", llama),
        ("mla", mla),
        ("sliding window", window),
        ("linear attention", linear),
        ("favor+", favor),
    ]
}

/// Weights of std 0.02 give near-uniform logits; std 0.16 (norm gains left at 1) makes the comparison sharp.
fn sharpened(model: CausalLm) -> CausalLm {
    let scaled: HashMap<String, TensorData> = state_dict(&model)
        .into_iter()
        .map(|(path, data)| {
            let k = if path.ends_with(".gamma") || path.ends_with(".beta") { 1.0 } else { 8.0 };
            let values: Vec<f32> = data.as_slice::<f32>().unwrap().iter().map(|x| x * k).collect();
            (path, TensorData::new(values, data.shape().to_vec()))
        })
        .collect();
    load_state_dict(model, &scaled).unwrap()
}

/// Greedy decoding of `steps` tokens after `prompt` with a store and by recomputation; returns the largest logit
/// difference and the largest logit.
fn cached_vs_recomputed(model: &CausalLm, kv: KvSpec, prompt: &[u32], steps: usize, device: &Device) -> (f32, f32) {
    let mut cached = Decoder::new(model, kv, device);
    let mut full = Decoder::new(model, KvKind::None, device);
    let mut ids = prompt.to_vec();
    let (mut seen, mut worst, mut scale) = (0, 0.0f32, 0.0f32);
    for _ in 0..steps {
        let a = cached.next_logits(&ids, seen);
        let b = full.next_logits(&ids, seen);
        worst = worst.max(max_diff(&a, &b));
        scale = b.iter().fold(scale, |m, x| m.max(x.abs()));
        seen = ids.len();
        let next = argmax(&b);
        ids.push(next);
    }
    (worst, scale)
}

fn prompt() -> Vec<u32> {
    let mut rng = Rng::new(9);
    (0..7).map(|_| rng.below(50) as u32).collect()
}

#[test]
fn cached_decoding_equals_full_recomputation_for_64_steps() {
    let device = Device::flex();
    for (name, config) in configs() {
        let model = sharpened(CausalLm::new(&config, &mut Rng::new(3), &device));
        let mut stores = vec![KvSpec::from(KvKind::Contiguous), KvSpec { page_size: 5, ..KvKind::Paged.into() }];
        if KvKind::for_model(&config) == KvKind::State {
            stores.push(KvKind::State.into());
        }
        for kv in stores {
            let (worst, _) = cached_vs_recomputed(&model, kv, &prompt(), 64, &device);
            assert!(worst <= 1e-5, "{name}, {:?}: max |cached − recomputed| = {worst}", kv.kind);
        }
    }
}

#[test]
fn int8_and_int4_stores_stay_close_and_int8_closer() {
    let device = Device::flex();
    for (name, config) in configs() {
        let model = sharpened(CausalLm::new(&config, &mut Rng::new(3), &device));
        let error = |kind: KvKind| {
            let (worst, scale) =
                cached_vs_recomputed(&model, KvSpec { group: 8, ..kind.into() }, &prompt(), 32, &device);
            worst / scale
        };
        let (int8, int4) = (error(KvKind::Int8), error(KvKind::Int4));
        assert!(int8 <= 0.01 && int4 <= 0.2 && int8 < int4, "{name}: relative logit error int8 {int8}, int4 {int4}");
    }
}

#[test]
fn contiguous_bytes_are_two_b_l_t_g_dh_floats() {
    let device = Device::flex();
    let ids = Tensor::<2, Int>::from_data(TensorData::new((0..24i64).collect::<Vec<_>>(), [2, 12]), &device);
    for (name, config) in configs() {
        let model = CausalLm::new(&config, &mut Rng::new(3), &device);
        let mut cache = ContiguousCache::new(1);
        model.forward_step(ids.clone(), &mut cache);
        let (b, l, t) = (2, config.n_layers, 12);
        // 2·B·L·T·g·d_h·4 bytes, or B·L·T·(d_c + d_R)·4 for MLA.
        let per_token_layer = match config.attention {
            AttentionKind::Mha => 2 * config.kv_heads() * config.head_dim(),
            AttentionKind::Mla => config.mla_latent_dim.unwrap() + config.mla_rope_dim.unwrap(),
        };
        assert_eq!(cache.bytes(), b * l * t * per_token_layer * 4, "{name}");
        assert_eq!(cache.usage(), (cache.bytes(), cache.bytes()));
    }
}

/// A linear-attention model's recurrent state holds L·g·(r·d_h + r) floats (and FAVOR+'s stabiliser per layer)
/// however many tokens it has seen.
#[test]
fn a_recurrent_state_keeps_the_same_bytes_at_every_length() {
    let device = Device::flex();
    for (name, config) in configs().into_iter().filter(|(_, c)| KvKind::for_model(c) == KvKind::State) {
        let model = CausalLm::new(&config, &mut Rng::new(3), &device);
        let mut cache = StateCache::default();
        let ids =
            |n: i64| Tensor::<2, Int>::from_data(TensorData::new((0..n).collect::<Vec<_>>(), [1, n as usize]), &device);
        model.forward_step(ids(12), &mut cache);
        let after_prompt = cache.bytes();
        for _ in 0..20 {
            model.forward_step(ids(1), &mut cache);
        }
        assert_eq!(cache.len(), 32);
        let r = config.favor_features.unwrap_or(config.head_dim());
        let favor = usize::from(config.attention_kernel == AttentionKernel::Favor);
        let expected = config.n_layers * (config.kv_heads() * (r * config.head_dim() + r) + favor) * 4;
        assert_eq!((after_prompt, cache.bytes()), (expected, expected), "{name}");
    }
}

#[test]
fn a_softmax_model_is_refused_a_recurrent_state() {
    let (_, gpt) = configs().swap_remove(0);
    let error = KvSpec::from(KvKind::State).check(&gpt).unwrap_err();
    assert!(error.contains("softmax"), "{error}");
    assert!(KvSpec::from(KvKind::State).check(&configs().swap_remove(4).1).is_ok());
}

#[test]
fn quantized_memory_counts_integers_and_scales() {
    let device = Device::flex();
    let (_, llama) = configs().swap_remove(1);
    let model = CausalLm::new(&llama, &mut Rng::new(3), &device);
    let ids = Tensor::<2, Int>::from_data(TensorData::new((0..20i64).collect::<Vec<_>>(), [1, 20]), &device);
    // 2 layers × 20 tokens × (k, v) × g = 2 heads × d_h = 8 = 640 values per entry kind, one scale per 8.
    let values = 2 * 20 * 2 * 2 * 8;
    for (bits, bytes_per_value) in [(Bits::Int8, 1.0), (Bits::Int4, 0.5)] {
        let mut cache = QuantizedCache::new(bits, 8);
        model.forward_step(ids.clone(), &mut cache);
        assert_eq!(cache.bytes(), (values as f64 * bytes_per_value) as usize + values / 8 * 4, "{bits:?}");
    }
}

#[test]
fn forked_sequences_share_prompt_pages_and_copy_on_write() {
    let device = Device::flex();
    let (_, llama) = configs().swap_remove(1);
    let model = sharpened(CausalLm::new(&llama, &mut Rng::new(3), &device));
    let row = |ids: &[i64]| Tensor::<2, Int>::from_data(TensorData::new(ids.to_vec(), [1, ids.len()]), &device);
    let prompt: Vec<i64> = (0..11).map(|i| (i * 7 % 50) as i64).collect();
    let pool = PagePool::new(4);
    let mut a = PagedCache::new(pool.clone());
    model.forward_step(row(&prompt), &mut a);
    let mut b = a.fork();
    // 11 tokens in pages of 4: three pages per layer, all shared after the fork.
    assert_eq!(a.table(0), b.table(0));
    assert_eq!(pool.borrow().allocator.counts(), (6, 6));
    assert_eq!(a.waste(), 2, "one unused slot in the last page of each of 2 layers");
    let la = model.forward_step(row(&[5]), &mut a);
    let lb = model.forward_step(row(&[9]), &mut b);
    // The third page (tokens 8..12) was written by both: each now has its own copy; pages 0 and 1 stay shared.
    assert_eq!(a.table(0)[..2], b.table(0)[..2]);
    assert_ne!(a.table(0)[2], b.table(0)[2]);
    assert_eq!(pool.borrow().allocator.users(a.table(0)[0]), 2);
    // Each continuation equals its own uncached recomputation.
    for (logits, next) in [(la, 5i64), (lb, 9)] {
        let mut ids = prompt.clone();
        ids.push(next);
        let full = model.forward(row(&ids));
        let v = full.dims()[2];
        let last = full.slice([0..1, 11..12, 0..v]).reshape([1, v]);
        let d: f32 = (logits - last).abs().max().into_scalar();
        assert!(d <= 1e-5, "forked continuation {next}: {d}");
    }
    drop(a);
    drop(b);
    assert_eq!(pool.borrow().allocator.counts().1, 0, "every page is free once both sequences end");
}

/// Prefix caching: a pool that indexes full prompt pages lets a later prompt start from the pages it shares with
/// earlier ones (never its last token, whose logits are needed), continues exactly as an uncached recomputation,
/// keeps pages after their sequences end, and holds at most its capacity.
#[test]
fn later_prompts_reuse_the_cached_pages_of_their_shared_prefix() {
    let device = Device::flex();
    let (_, llama) = configs().swap_remove(1);
    let model = sharpened(CausalLm::new(&llama, &mut Rng::new(3), &device));
    let row = |ids: &[u32]| {
        Tensor::<2, Int>::from_data(TensorData::new(ids.iter().map(|&i| i as i64).collect(), [1, ids.len()]), &device)
    };
    // The last position's logits of `ids` through a cache for it, and the tokens the cache started with.
    let run = |pool: &std::rc::Rc<std::cell::RefCell<PagePool>>, ids: &[u32]| {
        let mut cache = PagedCache::for_prompt(pool.clone(), ids);
        let reused = cache.len();
        let logits = model.forward_step(row(&ids[reused..]), &mut cache);
        let full = model.forward(row(ids));
        let (t, v) = (ids.len(), full.dims()[2]);
        let d: f32 = (logits - full.slice([0..1, t - 1..t, 0..v]).reshape([1, v])).abs().max().into_scalar();
        assert!(d <= 1e-5, "{ids:?} after {reused} cached tokens: {d}");
        (reused, cache)
    };
    let pool = PagePool::with_prefix_cache(4, 3);
    let a: Vec<u32> = (0..11).map(|i| (i * 7 % 50) as u32).collect();
    let (reused, first) = run(&pool, &a);
    assert_eq!((reused, pool.borrow().cached_pages()), (0, 2), "two full pages of 11 tokens indexed");
    let mut b = a[..9].to_vec();
    b.extend([40, 41, 42, 43, 44]);
    let (reused, second) = run(&pool, &b);
    assert_eq!(reused, 8, "the two pages b shares with a; its third page differs after one token");
    assert_eq!(second.table(0)[..2], first.table(0)[..2]);
    assert_eq!(run(&pool, &a).0, 8, "the same prompt again");
    assert_eq!(run(&pool, &a[..8]).0, 4, "a prompt of two whole pages computes its last page");
    drop((first, second));
    let cached = pool.borrow().cached_pages();
    assert_eq!(cached, 3, "a's two pages and b's third");
    assert_eq!(pool.borrow().allocator.counts().1, 2 * cached, "the index keeps its pages in both layers");
    let other: Vec<u32> = (0..13).map(|i| (i * 3 % 50 + 1) as u32).collect();
    run(&pool, &other);
    assert_eq!(pool.borrow().cached_pages(), 3, "at most the capacity, the least recently used evicted");
    assert_eq!(run(&pool, &other).0, 12);
}

#[test]
fn eight_requests_sharing_a_256_token_prompt_use_a_quarter_of_the_pages() {
    let device = Device::flex();
    let config = ModelConfig { block_size: 320, ..configs().swap_remove(1).1 };
    let model = CausalLm::new(&config, &mut Rng::new(3), &device);
    let row = |ids: &[i64]| Tensor::<2, Int>::from_data(TensorData::new(ids.to_vec(), [1, ids.len()]), &device);
    let prompt: Vec<i64> = (0..256).map(|i| (i * 13 % 50) as i64).collect();
    let pages_in_use = |shared: bool| {
        let pool = PagePool::new(16);
        let mut first = PagedCache::new(pool.clone());
        model.forward_step(row(&prompt), &mut first);
        let mut sequences: Vec<PagedCache> = (1..8)
            .map(|_| {
                if shared {
                    first.fork()
                } else {
                    let mut own = PagedCache::new(pool.clone());
                    model.forward_step(row(&prompt), &mut own);
                    own
                }
            })
            .collect();
        sequences.push(first);
        for (i, sequence) in sequences.iter_mut().enumerate() {
            for step in 0..16 {
                model.forward_step(row(&[(i * 5 + step) as i64 % 50]), sequence);
            }
        }
        let (_, in_use) = pool.borrow().allocator.counts();
        in_use
    };
    let (shared, unshared) = (pages_in_use(true), pages_in_use(false));
    // Unshared: 8 × 17 pages per layer; shared: the prompt's 16 once, plus each sequence's own page.
    assert_eq!(unshared, 2 * 8 * 17);
    assert!(shared * 4 <= unshared, "shared {shared} pages vs unshared {unshared}");
}

#[test]
fn batched_decoding_of_ragged_sequences_equals_one_at_a_time() {
    let device = Device::flex();
    let row = |ids: &[u32]| {
        let data = TensorData::new(ids.iter().map(|&i| i as i64).collect::<Vec<_>>(), [1, ids.len()]);
        Tensor::<2, Int>::from_data(data, &device)
    };
    for (name, config) in configs() {
        let model = sharpened(CausalLm::new(&config, &mut Rng::new(3), &device));
        // Three prompts of different lengths (the window is 12: the longest outgrows it).
        let prompts: Vec<Vec<u32>> =
            [3usize, 9, 17].iter().map(|&n| (0..n as u32).map(|i| (i * 7 + n as u32) % 50).collect()).collect();
        let mut alone: Vec<ContiguousCache> = prompts.iter().map(|_| ContiguousCache::new(8)).collect();
        // Batched from the model's own store: a linear-attention model's recurrent state.
        let store = KvSpec::from(KvKind::for_model(&config));
        let mut batched: Vec<Box<dyn KvCache>> = prompts.iter().map(|_| store.build().expect("a store")).collect();
        let mut next: Vec<u32> = Vec::new();
        for ((p, a), b) in prompts.iter().zip(&mut alone).zip(&mut batched) {
            let logits = model.forward_step(row(p), a);
            model.forward_step(row(p), b.as_mut());
            next.push(logits.argmax(1).into_scalar::<i64>() as u32);
        }
        for step in 0..10 {
            let mut caches: Vec<&mut dyn KvCache> = Vec::new();
            for cache in &mut batched {
                caches.push(cache.as_mut());
            }
            let together = model.forward_batch(&next, &mut caches).into_data().try_to_vec::<f32>().unwrap();
            let v = together.len() / next.len();
            for (i, cache) in alone.iter_mut().enumerate() {
                let one = model.forward_step(row(&next[i..i + 1]), cache).into_data().try_to_vec::<f32>().unwrap();
                let d = max_diff(&one, &together[i * v..(i + 1) * v]);
                assert!(d <= 1e-5, "{name}, step {step}, row {i}: {d}");
            }
            next = (0..next.len()).map(|i| argmax(&together[i * v..(i + 1) * v])).collect();
        }
    }
}

/// Each imported family (Qwen2's biases, Qwen3's head norms, Mistral's and Phi-3's sliding window of 5, Gemma 2's
/// soft-capped scores and logits and alternating window, Gemma 3's RoPE stretched on its global layer only, DeepSeek-V2's latent attention (absorbed against the cached
/// latents), Llama 3.1, linear, YaRN, dynamic NTK and LongRoPE scaling
/// past the original context of 32), from its Hugging Face directory
/// and from llama.cpp's GGUF of it where there is one, continues its fixture's 8 prompt tokens with the 32 tokens
/// transformers' cached greedy decoding chose (scripts/reference/hf_fixtures.py), through a contiguous and a paged
/// store.
#[test]
fn imported_families_decode_greedily_as_transformers_through_the_stores() {
    let fixtures = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../core-model/tests/fixtures/hf");
    let device = Device::flex();
    let families = [
        "qwen2-tiny",
        "qwen3-tiny",
        "mistral-tiny",
        "phi3-tiny",
        "llama3-rope-tiny",
        "linear-rope-tiny",
        "yarn-rope-tiny",
        "dynamic-rope-tiny",
        "longrope-tiny",
        "gemma2-tiny",
        "gemma2-scalar-tiny",
        "gemma3-tiny",
        "deepseek2-tiny",
        "deepseek2-yarn-tiny",
    ];
    for name in families {
        let (config, tensors) = ember_core_model::import::hf::load(&fixtures.join(name)).unwrap();
        let mut models = vec![CausalLm::load(&config, &tensors, &device).unwrap()];
        let gguf = fixtures.join(format!("{name}.gguf"));
        if gguf.exists() {
            let (config, weights, _, _) = ember_core_model::import::gguf_model::load(&gguf).unwrap();
            models.push(CausalLm::load_packed(&config, &weights.dense, &weights.packed, &device).unwrap());
        }
        let (expected, _) =
            ember_core_model::bundle::load_tensors(&fixtures.join(name).join("expected.safetensors")).unwrap();
        let want: Vec<u32> = expected["greedy_ids"].as_slice::<f32>().unwrap().iter().map(|&x| x as u32).collect();
        let stores = [KvSpec::from(KvKind::Contiguous), KvSpec { page_size: 5, ..KvKind::Paged.into() }];
        for (model, kv) in models.iter().flat_map(|m| stores.map(|kv| (m, kv))) {
            let mut decoder = Decoder::new(model, kv, &device);
            let (mut ids, mut seen) = (want[..8].to_vec(), 0);
            while ids.len() < want.len() {
                let next = argmax(&decoder.next_logits(&ids, seen));
                seen = ids.len();
                ids.push(next);
            }
            assert_eq!(ids, want, "{name}, {:?}", kv.kind);
        }
    }
}
