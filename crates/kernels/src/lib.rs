//! Attention and other hot ops behind one entry point per op. Every model calls [`attention`]; which
//! implementation runs is chosen here, so models never change when a faster kernel lands.
//!
//! `spec` says what an attention call computes and depends on nothing else; `attention` routes it to `flash`
//! (Ember's kernels), `similarity` (feature-map attention) or the reference. `cpu` and `wgsl` are the two ways
//! a kernel runs: Rust over burn-flex slices, or a WGSL shader launched through CubeCL.

pub mod activation;
pub mod adamw;
pub mod adapters;
pub mod attention;
mod cpu;
pub mod cross_entropy;
pub mod flash;
pub mod gemm;
pub mod linear;
mod math;
pub mod memory;
pub mod norm;
pub mod packed;
pub mod scan;
pub mod similarity;
pub mod spec;
pub mod tape;
mod wgsl;

pub use activation::{geglu, gelu, gelu_tanh, swiglu};
pub use adamw::{AdamWStep, adamw};
pub use adapters::{Adapter, wgpu_adapters};
pub use attention::{attention, merge_heads, packed_attention, reference_attention, split_heads};
pub use cpu::level;
pub use cpu::{KeepWorkersAwake, keep_workers_awake, on_cpu};
pub use cross_entropy::cross_entropy;
pub use flash::{Int8Kv, decodes_in_place, flash_attention, int8_attention, paged_attention};
pub use linear::{linear, tied_linear};
pub use memory::{DeviceMemory, device_memory};
pub use norm::{NormParams, norm};
pub use packed::PackedLinear;
pub use similarity::{LinearState, recurrent_attention, similarity_attention};
pub use spec::{
    AttentionAlgorithm, AttentionSpec, GpuTuning, KernelTier, NAMED_ATTENTION, PackedHeads, Similarity, named_attention,
};
pub use wgsl::on_wgpu;
