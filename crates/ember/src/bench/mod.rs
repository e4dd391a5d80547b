//! `ember bench ...`: measurements kept apart from the commands that train and serve. Each compares Ember with a
//! reference measured side by side in the same run (PyTorch, transformers, naive attention, recomputation).

mod attention;
mod context;
mod convert;
mod decode;
mod gemm;
mod kernel;
mod kv;
mod memory;
mod reference;
mod serve;
mod train;
mod weights;

use std::rc::Rc;

use anyhow::Result;
use clap::Subcommand;
use ember_train::collective::Collective;

use crate::devices::DeviceChoice;

#[derive(Subcommand)]
pub enum BenchCommand {
    /// Training throughput on a run config.
    Train(train::BenchTrainArgs),
    /// Generation tokens/s, KV-cached against recomputation.
    Decode(decode::BenchDecodeArgs),
    /// The HTTP server under concurrent streaming clients.
    Serve(serve::BenchServeArgs),
    /// KV stores: bytes, and the loss of a text teacher-forced through each.
    Kv(kv::BenchKvArgs),
    /// A trained softmax model run with FAVOR+ random features: the loss change against r.
    Kernel(kernel::BenchKernelArgs),
    /// Attention kernels: Ember's, the naive path and Burn's built-in, forward and backward.
    Attention(attention::BenchAttentionArgs),
    /// Matrix products: Burn's matmul in f32 and f16 against Ember's cooperative-matrix GEMM.
    Gemm(gemm::BenchGemmArgs),
    /// Softmax against linear attention as the context grows: seconds per training step and per decoded token.
    Context(context::BenchContextArgs),
    /// A trained model converted to MLA at several latent widths: KV bytes against loss.
    Convert(convert::BenchConvertArgs),
    /// One model in several weight formats (f32, its own blocks, f16, Q8_0, Q4_0, …): bytes against loss.
    Weights(weights::BenchWeightsArgs),
}

pub fn bench(command: BenchCommand, device: DeviceChoice, collective: Rc<dyn Collective>) -> Result<()> {
    match command {
        BenchCommand::Train(args) => train::bench_train(args, device, collective),
        BenchCommand::Decode(args) => decode::bench_decode(args, device),
        BenchCommand::Serve(args) => serve::bench_serve(args, device),
        BenchCommand::Kv(args) => kv::bench_kv(args, device),
        BenchCommand::Kernel(args) => kernel::bench_kernel(args, device),
        BenchCommand::Attention(args) => attention::bench_attention(args, device),
        BenchCommand::Gemm(args) => gemm::bench_gemm(args, device),
        BenchCommand::Context(args) => context::bench_context(args, device),
        BenchCommand::Convert(args) => convert::bench_convert(args, device),
        BenchCommand::Weights(args) => weights::bench_weights(args, device),
    }
}

pub fn median(xs: &mut [f64]) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}
