//! Packed products on wgpu: the blocks are a u32 buffer and `shaders/packed_matmul.wgsl` dequantizes every format in
//! the shader, an invocation per output value, x in f32.

use burn::backend::wgpu::{CubeBackend, CubeTensor, into_contiguous};
use burn::tensor::DType;

use super::{Layout, PackedOps};
use crate::wgsl::{Wgsl, empty, f32_contiguous, launch};

/// The shader of `shaders/packed_matmul.wgsl`: products, or the rows lookup.
fn shader(rows: bool) -> Wgsl {
    Wgsl {
        name: "packed_matmul",
        text: include_str!("../../../../shaders/packed_matmul.wgsl"),
        values: vec![("rows", rows.to_string())],
    }
}

/// The info words of the shader: n, k, m, parts, then (ggml type, rows, bytes per row) per part.
fn shader_info(n: usize, layout: &Layout) -> Vec<u32> {
    let mut info = vec![n as u32, layout.cols as u32, layout.rows() as u32, layout.parts.len() as u32];
    for part in &layout.parts {
        let row_bytes = part.format.row_bytes(layout.cols).expect("whole blocks");
        info.extend([part.format.id, part.rows as u32, row_bytes as u32]);
    }
    info
}

/// A grid of workgroups of 64 invocations covering `items` (at most 65,535 workgroups along x).
fn grid(items: usize) -> (u32, u32) {
    let groups = items.div_ceil(64).max(1);
    let across = groups.min(65535);
    (across as u32, groups.div_ceil(across) as u32)
}

impl PackedOps for CubeBackend {
    fn packed_matmul(x: CubeTensor, blocks: CubeTensor, layout: Layout) -> CubeTensor {
        let x = f32_contiguous(x);
        let n = x.meta.shape()[0];
        let y = empty(&x, &[n, layout.rows()], DType::F32);
        if n * layout.rows() > 0 {
            launch(&x, shader(false), 64, grid(n * layout.rows()), &[&x, &blocks, &y], &shader_info(n, &layout));
        }
        y
    }

    fn packed_rows(blocks: CubeTensor, ids: CubeTensor, layout: Layout) -> CubeTensor {
        assert_eq!(ids.dtype.size(), 4, "token ids on wgpu are 32-bit");
        let ids = into_contiguous(ids);
        let n = ids.meta.shape()[0];
        let y = empty(&blocks, &[n, layout.cols], DType::F32);
        if n > 0 {
            launch(&blocks, shader(true), 64, grid(n), &[&ids, &blocks, &y], &shader_info(n, &layout));
        }
        y
    }
}
