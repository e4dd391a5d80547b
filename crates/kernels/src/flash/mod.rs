//! Ember's WGSL FlashAttention on wgpu tensors: a tiled forward that saves the row log-sum-exp, a FlashAttention-2
//! backward registered with autodiff, flash-decoding for a few query rows against a long cache, and a paged variant
//! that reads keys and values through a page table. Shaders are in `shaders/`; [`crate::attention`] routes here.

mod autodiff;
mod cube;

use burn::backend::fusion::custom::TensorSpec;
use burn::backend::{Backend, Dispatch, backend_extension, tensor::FloatTensor};
use burn::tensor::{DType, Shape, Tensor};

use crate::attention::AttentionSpec;

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
    /// Reading keys and values from page pools [pages, Hkv, P, D] instead of [B, Hkv, Tk, D].
    pub paging: Option<Paging>,
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
            paging: None,
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

/// Attention as backend operations; the wgpu implementation launches the WGSL kernels.
#[backend_extension(Cube, Fusion, Autodiff)]
pub trait FlashOps: Backend {
    /// (o, lse): o = softmax(q kᵀ·scale + mask) v and lse_i = log Σ_j e^(s_ij), tiled or split over keys.
    #[fusion(meta = forward_meta)]
    fn flash_forward(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        params: FlashParams,
    ) -> (FloatTensor<Self>, FloatTensor<Self>);

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

/// True when `tensor` lives on a wgpu device (with or without autodiff), where the WGSL kernels run.
pub fn on_wgpu(tensor: &Tensor<4>) -> bool {
    matches!(tensor.device().as_dispatch().clone().inner(), burn::backend::DispatchDevice::Cube(_))
}

/// o = softmax(q kᵀ·scale + mask) v on wgpu with Ember's kernels; differentiable under autodiff.
pub fn flash_attention(q: Tensor<4>, k: Tensor<4>, v: Tensor<4>, spec: &AttentionSpec) -> Tensor<4> {
    run(q, k, v, FlashParams::new(spec))
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
    let params = FlashParams { paging: Some(Paging { page_size, keys, table }), ..FlashParams::new(spec) };
    run(q, k_pages, v_pages, params)
}

fn run(q: Tensor<4>, k: Tensor<4>, v: Tensor<4>, params: FlashParams) -> Tensor<4> {
    let (o, _lse) =
        <Dispatch as FlashOps>::flash_forward(q.into_dispatch(), k.into_dispatch(), v.into_dispatch(), params);
    Tensor::from_dispatch(o)
}
