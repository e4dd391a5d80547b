//! Matrix products on cooperative matrices: C = A B with A and B rounded to f16 and every product accumulated in
//! f32 (`shaders/gemm_coop.wgsl`), on wgpu adapters whose cooperative matrices include S×S×S f16 → f32 products
//! ([`crate::Adapter::cooperative_sides`]: S = 16 on GPUs under Vulkan, where they are tensor cores; 8 on Mesa 26's
//! lavapipe). On the CPU the same op is Burn's f32 matmul of the f16-rounded operands, the value the kernel's
//! accumulation approximates.

use burn::backend::fusion::custom::TensorSpec;
use burn::backend::ops::FloatTensorOps;
use burn::backend::wgpu::CubeBackend;
use burn::backend::{Backend, Dispatch, Flex, backend_extension, tensor::FloatTensor};
use burn::tensor::{DType, FloatDType, Shape, Tensor};

use crate::wgsl::{Wgsl, empty, launch};

fn matmul_meta(a: &TensorSpec, b: &TensorSpec, _side: &u32) -> TensorSpec {
    TensorSpec::new(Shape::from(vec![a.shape[0], b.shape[1]]), DType::F32)
}

/// The cooperative-matrix product as a backend operation.
#[backend_extension(Cube, Flex, Fusion)]
pub trait CooperativeOps: Backend {
    /// A [M, K] B [K, N] → [M, N] f32 on `side`×`side` f16 matrices with f32 accumulators.
    #[fusion(meta = matmul_meta)]
    fn cooperative_matmul(a: FloatTensor<Self>, b: FloatTensor<Self>, side: u32) -> FloatTensor<Self>;
}

/// A B for A [M, K] and B [K, N] (f32 or f16) on `side`×`side` cooperative matrices (16 or 8, one the adapter
/// offers), f32 out.
pub fn cooperative_matmul(a: Tensor<2>, b: Tensor<2>, side: u32) -> Tensor<2> {
    assert_eq!(a.dims()[1], b.dims()[0], "A [M, K] B [K, N]: inner sizes {} and {}", a.dims()[1], b.dims()[0]);
    let c = <Dispatch as CooperativeOps>::cooperative_matmul(a.into_dispatch(), b.into_dispatch(), side);
    Tensor::from_dispatch(c)
}

impl CooperativeOps for Flex {
    fn cooperative_matmul(a: FloatTensor<Self>, b: FloatTensor<Self>, _side: u32) -> FloatTensor<Self> {
        let round = |t: FloatTensor<Self>| Self::float_cast(Self::float_cast(t, FloatDType::F16), FloatDType::F32);
        Self::float_matmul(round(a), round(b))
    }
}

impl CooperativeOps for CubeBackend {
    fn cooperative_matmul(a: FloatTensor<Self>, b: FloatTensor<Self>, side: u32) -> FloatTensor<Self> {
        assert!(side == 8 || side == 16, "cooperative matrices of side {side}: WGSL has 8×8 and 16×16");
        assert_eq!(a.dtype, b.dtype, "A and B in one type");
        let (a, b) = (burn::backend::wgpu::into_contiguous(a), burn::backend::wgpu::into_contiguous(b));
        let (m, k, n) = (a.meta.shape()[0], a.meta.shape()[1], b.meta.shape()[1]);
        let c = empty(&a, &[m, n], DType::F32);
        if m * n == 0 {
            return c;
        }
        if k == 0 {
            return Self::float_zeros(Shape::from(vec![m, n]), &c.device, FloatDType::F32);
        }
        let threads = a.client.properties().hardware.plane_size_max.max(side);
        let block = 2 * side as usize;
        let f16 = a.dtype == DType::F16;
        let kernel = Wgsl {
            name: "gemm_coop",
            text: include_str!("../../../shaders/gemm_coop.wgsl"),
            values: vec![
                ("threads", threads.to_string()),
                ("n", side.to_string()),
                ("block", block.to_string()),
                ("slice", (block * side as usize).to_string()),
                ("square", (block * block).to_string()),
                ("mat", format!("coop_mat{side}x{side}")),
                ("types", format!("enable f16;\nalias Elem = {};", if f16 { "f16" } else { "f32" })),
            ],
        };
        let count = (n.div_ceil(block) as u32, m.div_ceil(block) as u32);
        launch(&a, kernel, threads, count, &[&a, &b, &c], &[m as u32, k as u32, n as u32]);
        c
    }
}
