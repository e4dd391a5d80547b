//! The exclusive prefix sum along the chunk axis that causal linear attention's chunked form takes (the state of the
//! chunks before each one): y_c = Σ_{c' < c} x_c' along dim 1, whose gradient is the reverse sum Σ_{c' > c}. On wgpu
//! one WGSL kernel (`shaders/linear_scan.wgsl`) walks each element's chunks once; on burn-flex it is cumsum less the
//! element; both differentiable.

use burn::backend::Flex;
use burn::backend::fusion::custom::TensorSpec;
use burn::backend::ops::FloatTensorOps;
use burn::backend::wgpu::{CubeBackend, CubeTensor};
use burn::backend::{Backend, Dispatch, backend_extension, tensor::FloatTensor};
use burn::tensor::{DType, Tensor};

use crate::cpu::on_cpu;
use crate::tape::{Autodiff, Backward, CheckpointStrategy, Checkpointer, Gradients, Ops, OpsKind};
use crate::wgsl::{Wgsl, empty, f32_contiguous, launch, on_wgpu};

/// Invocations per workgroup of the scan kernel.
const WORKGROUP: usize = 64;

fn scan_meta(x: &TensorSpec, _reverse: &bool) -> TensorSpec {
    x.clone()
}

#[backend_extension(Cube, Flex, Fusion, Autodiff)]
pub trait ScanOps: Backend {
    /// y with y_c = Σ_{c' < c} x_c' along dim 1 of x [N, C, …] (`reverse`: Σ_{c' > c}).
    #[fusion(meta = scan_meta)]
    fn exclusive_scan(x: FloatTensor<Self>, reverse: bool) -> FloatTensor<Self>;
}

/// y_c = Σ_{c' < c} x_c' along dim 1 of x [N, C, A, B]: the scan op on wgpu and burn-flex, cumsum elsewhere.
pub fn exclusive_scan(x: Tensor<4>) -> Tensor<4> {
    if on_wgpu(&x.device()) || on_cpu(&x.device()) {
        Tensor::from_dispatch(<Dispatch as ScanOps>::exclusive_scan(x.into_dispatch(), false))
    } else {
        x.clone().cumsum(1) - x
    }
}

impl ScanOps for CubeBackend {
    fn exclusive_scan(x: CubeTensor, reverse: bool) -> CubeTensor {
        let x = f32_contiguous(x);
        let dims = x.meta.shape().as_slice().to_vec();
        let (outer, chunks, inner) = (dims[0], dims[1], dims[2..].iter().product::<usize>());
        let y = empty(&x, &dims, DType::F32);
        let groups = (outer * inner).div_ceil(WORKGROUP);
        if groups * chunks > 0 {
            let kernel =
                Wgsl { name: "linear_scan", text: include_str!("../../../shaders/linear_scan.wgsl"), values: vec![] };
            let across = groups.min(65535);
            let count = (across as u32, groups.div_ceil(across) as u32);
            let info = [outer, chunks, inner, usize::from(reverse)].map(|n| n as u32);
            launch(&x, kernel, WORKGROUP as u32, count, &[&x, &y], &info);
        }
        y
    }
}

impl ScanOps for Flex {
    fn exclusive_scan(x: FloatTensor<Self>, reverse: bool) -> FloatTensor<Self> {
        let inclusive = Flex::float_cumsum(x.clone(), 1);
        match reverse {
            // Σ_{c' > c} = Σ_all − Σ_{c' ≤ c}.
            true => Flex::float_sub(Flex::float_sum_dim(x, 1), inclusive),
            false => Flex::float_sub(inclusive, x),
        }
    }
}

#[derive(Debug)]
struct ScanBackward;

impl<B: ScanOps> Backward<B, 1> for ScanBackward {
    /// The forward's direction.
    type State = bool;

    /// ∂L/∂x_c = Σ_{c' > c} ∂L/∂y_c' for the forward scan (and the mirror for the reverse one).
    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _checkpointer: &mut Checkpointer) {
        let [node] = ops.parents;
        let d_y = grads.consume::<B>(&ops.node);
        if let Some(node) = node {
            grads.register::<B>(node.id, B::exclusive_scan(d_y, !ops.state));
        }
    }
}

impl<B: ScanOps, C: CheckpointStrategy> ScanOps for Autodiff<B, C> {
    fn exclusive_scan(x: FloatTensor<Self>, reverse: bool) -> FloatTensor<Self> {
        match ScanBackward.prepare::<C>([x.node()]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => prep.finish(reverse, B::exclusive_scan(x.into_primitive(), reverse)),
            OpsKind::UnTracked(prep) => prep.finish(B::exclusive_scan(x.into_primitive(), reverse)),
        }
    }
}
