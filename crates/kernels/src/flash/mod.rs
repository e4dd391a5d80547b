//! Ember's WGSL FlashAttention on wgpu tensors: a tiled forward that saves the row log-sum-exp, a FlashAttention-2
//! backward registered with autodiff, flash-decoding for a few query rows against a long cache, and decoding variants
//! that read keys and values through a page table or as int8 codes dequantized in the kernel. Shaders are in `shaders/`;
//! the same operations on the CPU are Rust (`flex.rs`). [`crate::attention`] routes here.

mod autodiff;
mod cube;
mod flex;
mod tiers;

use burn::backend::fusion::custom::TensorSpec;
use burn::backend::{
    Backend, Dispatch, backend_extension,
    tensor::{FloatTensor, IntTensor},
};
use burn::tensor::{DType, Int, Shape, Tensor};

use crate::spec::{AttentionSpec, GpuTuning, PackedHeads, Similarity};
use crate::wgsl::on_wgpu;

/// Head dimensions the kernels take: multiples of 4 (rows are vec4s) up to 256.
pub fn supports_head_dim(d: usize) -> bool {
    d.is_multiple_of(4) && (4..=256).contains(&d)
}

/// Host-side description of one attention call, handed to the kernels in their `info` buffer.
#[derive(Clone, Debug, PartialEq)]
pub struct FlashParams {
    pub scale: f32,
    pub causal: bool,
    pub query_offset: usize,
    /// Sliding causal window (0: none).
    pub window: usize,
    /// Valid keys per batch row (empty: all of them).
    pub key_lengths: Vec<usize>,
    /// Where keys and values are read from.
    pub layout: KvLayout,
    /// How the WGSL kernels run (the CPU kernels ignore it).
    pub tuning: GpuTuning,
}

/// How keys and values are stored.
#[derive(Clone, Debug, PartialEq)]
pub enum KvLayout {
    /// [B, Hkv, Tk, D] f32.
    Contiguous,
    /// f32 page pools [pages, Hkv, P, D] read through a page table.
    Paged(Paging),
    /// int8 codes, token-major [B, Tk, Hkv·D], four to a 32-bit word, with one f32 scale per `group` values.
    Int8 { group: usize, keys: usize },
}

/// A page table: token j of batch row b is at slot j mod `page_size` of page `table[b][⌊j / page_size⌋]`.
#[derive(Clone, Debug, PartialEq)]
pub struct Paging {
    pub page_size: usize,
    /// Logical keys per batch row (the longest sequence).
    pub keys: usize,
    pub table: Vec<Vec<usize>>,
}

impl FlashParams {
    fn new(spec: &AttentionSpec) -> Self {
        Self {
            scale: spec.scale as f32,
            causal: spec.causal,
            query_offset: spec.query_offset,
            window: spec.window.unwrap_or(0),
            key_lengths: spec.key_lengths.clone().unwrap_or_default(),
            layout: KvLayout::Contiguous,
            tuning: spec.tuning,
        }
    }
}

fn forward_meta(q: &TensorSpec, _k: &TensorSpec, _v: &TensorSpec, _params: &FlashParams) -> (TensorSpec, TensorSpec) {
    let lse = Shape::from(vec![q.shape[0], q.shape[1], q.shape[2]]);
    (q.clone(), TensorSpec::new(lse, DType::F32))
}

#[allow(clippy::type_complexity)]
fn backward_meta(
    q: &TensorSpec,
    k: &TensorSpec,
    v: &TensorSpec,
    _d_o: &TensorSpec,
    _lse: &TensorSpec,
    _delta: &TensorSpec,
    _params: &FlashParams,
) -> (TensorSpec, TensorSpec, TensorSpec) {
    (q.clone(), k.clone(), v.clone())
}

fn int8_meta(
    q: &TensorSpec,
    _k_codes: &TensorSpec,
    _k_scales: &TensorSpec,
    _v_codes: &TensorSpec,
    _v_scales: &TensorSpec,
    _params: &FlashParams,
) -> TensorSpec {
    q.clone()
}

/// Attention as backend operations; the wgpu implementation launches the WGSL kernels.
#[backend_extension(Cube, Flex, Fusion, Autodiff)]
pub trait FlashOps: Backend {
    /// (o, lse): o = softmax(q kᵀ·scale + mask) v and lse_i = log Σ_j e^(s_ij), tiled or split over keys.
    #[fusion(meta = forward_meta)]
    fn flash_forward(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        params: FlashParams,
    ) -> (FloatTensor<Self>, FloatTensor<Self>);
}

/// Attention against int8 keys and values, for decoding (no autodiff).
#[backend_extension(Cube, Flex, Fusion)]
pub trait Int8AttentionOps: Backend {
    /// o for a few query rows against int8 keys and values (see [`Int8Kv`]); inference only.
    #[fusion(meta = int8_meta)]
    fn flash_decode_int8(
        q: FloatTensor<Self>,
        k_codes: IntTensor<Self>,
        k_scales: FloatTensor<Self>,
        v_codes: IntTensor<Self>,
        v_scales: FloatTensor<Self>,
        params: FlashParams,
    ) -> FloatTensor<Self>;
}

/// Attention's backward, run by the autodiff tape on the inner backend; the wgpu implementation launches the WGSL kernels.
#[backend_extension(Cube, Flex, Fusion)]
pub trait FlashGradOps: Backend {
    /// (dq, dk, dv) from dO, the saved lse and D = rowsum(dO ⊙ o).
    #[allow(clippy::type_complexity)]
    #[fusion(meta = backward_meta)]
    fn flash_backward(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        d_o: FloatTensor<Self>,
        lse: FloatTensor<Self>,
        delta: FloatTensor<Self>,
        params: FlashParams,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>);
}

/// Self-attention reading q, k and v in place from a fused projection and writing o's heads side by side (CPU).
#[backend_extension(Flex, Autodiff)]
pub trait PackedAttentionOps: Backend {
    /// (o [B, T, hq·d], lse [B, hq, T]) of attention over qkv [B, T, (hq + 2·hkv)·d].
    fn packed_attention_forward(
        qkv: FloatTensor<Self>,
        heads: PackedHeads,
        params: FlashParams,
    ) -> (FloatTensor<Self>, FloatTensor<Self>);
}

/// Query rows up to which attention decodes with split keys (and stores may read their own layouts in place).
pub const DECODE_ROWS: usize = 4;

/// True when a KV store may hand q and its own layout to [`paged_attention`] or [`int8_attention`]: q is on wgpu,
/// its head width is supported, it has at most [`DECODE_ROWS`] query rows and its scores are not soft-capped.
pub fn decodes_in_place(q: &Tensor<4>, spec: &AttentionSpec) -> bool {
    let [_, _, t, d] = q.dims();
    let softmax = spec.similarity == Similarity::Softmax && spec.softcap.is_none();
    softmax && t <= DECODE_ROWS && supports_head_dim(d) && on_wgpu(&q.device())
}

/// o = softmax(q kᵀ·scale + mask) v on wgpu with Ember's kernels; differentiable under autodiff.
pub fn flash_attention(q: Tensor<4>, k: Tensor<4>, v: Tensor<4>, spec: &AttentionSpec) -> Tensor<4> {
    run(q, k, v, FlashParams::new(spec))
}

/// o = softmax(q kᵀ·scale + mask) v over a fused projection qkv [B, T, (hq + 2·hkv)·d] on the CPU, o's heads
/// concatenated [B, T, hq·d]: no copies to split or merge heads; differentiable under autodiff.
pub fn packed_flash_attention(qkv: Tensor<3>, heads: PackedHeads, spec: &AttentionSpec) -> Tensor<3> {
    let params = FlashParams::new(spec);
    let (o, _lse) = <Dispatch as PackedAttentionOps>::packed_attention_forward(qkv.into_dispatch(), heads, params);
    Tensor::from_dispatch(o)
}

/// Decoding attention against a paged cache: k_pages, v_pages [pages, Hkv, P, D], `table[b]` the pages of batch
/// row b in order, `keys` its cached length (the longest row's; shorter rows through `spec.key_lengths`).
pub fn paged_attention(
    q: Tensor<4>,
    k_pages: Tensor<4>,
    v_pages: Tensor<4>,
    table: Vec<Vec<usize>>,
    keys: usize,
    spec: &AttentionSpec,
) -> Tensor<4> {
    let page_size = k_pages.dims()[2];
    let params = FlashParams { layout: KvLayout::Paged(Paging { page_size, keys, table }), ..FlashParams::new(spec) };
    run(q, k_pages, v_pages, params)
}

/// Keys and values quantized to int8, as serve's quantized store keeps them: per batch row and token the Hkv·D codes
/// packed four to an i32 word (little-endian bytes), [B, Tk, Hkv·D/4], and one scale per `group` values,
/// [B, Tk, Hkv·D/group]. Decoding attention dequantizes them as it reads them: x̂ = s · q.
pub struct Int8Kv {
    pub k_codes: Tensor<3, Int>,
    pub k_scales: Tensor<3>,
    pub v_codes: Tensor<3, Int>,
    pub v_scales: Tensor<3>,
    pub group: usize,
}

/// Decoding attention (up to a few query rows) against an int8 cache, dequantized in the kernel.
pub fn int8_attention(q: Tensor<4>, kv: Int8Kv, spec: &AttentionSpec) -> Tensor<4> {
    let keys = kv.k_codes.dims()[1];
    let params = FlashParams { layout: KvLayout::Int8 { group: kv.group, keys }, ..FlashParams::new(spec) };
    Tensor::from_dispatch(<Dispatch as Int8AttentionOps>::flash_decode_int8(
        q.into_dispatch(),
        kv.k_codes.into_dispatch(),
        kv.k_scales.into_dispatch(),
        kv.v_codes.into_dispatch(),
        kv.v_scales.into_dispatch(),
        params,
    ))
}

fn run(q: Tensor<4>, k: Tensor<4>, v: Tensor<4>, params: FlashParams) -> Tensor<4> {
    let (o, _lse) =
        <Dispatch as FlashOps>::flash_forward(q.into_dispatch(), k.into_dispatch(), v.into_dispatch(), params);
    Tensor::from_dispatch(o)
}
