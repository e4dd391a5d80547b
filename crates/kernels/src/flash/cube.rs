//! Launching the WGSL kernels on CubeCL wgpu tensors.

use burn::backend::wgpu::{
    CubeBackend, CubeDim, CubeTensor, KernelSource, SourceKernel, SourceTemplate, into_contiguous,
};
use burn::cubecl::{CubeCount, features::Plane, prelude::KernelId, server::KernelArguments};
use burn::tensor::{DType, Shape};

use super::tiers::Geometry;
use super::{DECODE_ROWS, FlashOps, FlashParams, KernelTier, KvLayout};

/// Invocations of a flash-decoding workgroup, and keys per split.
const DECODE_WG: u32 = 64;
const SPLIT: usize = 256;

/// The tier `params` forces, else the adapter's best: subgroups where cubecl reports them (it does not on CPU
/// adapters such as lavapipe, though the device has them) and their size holds a group of lanes.
fn tier(like: &CubeTensor, params: &FlashParams) -> KernelTier {
    let properties = like.client.properties();
    let subgroups = properties.features.plane.contains(Plane::Ops) && properties.hardware.plane_size_min >= 8;
    params.tier.unwrap_or(if subgroups { KernelTier::Subgroup } else { KernelTier::Portable })
}

/// A WGSL file with its `{{ name }}` placeholders filled.
#[derive(Debug)]
struct Wgsl {
    name: &'static str,
    text: &'static str,
    values: Vec<(&'static str, String)>,
}

impl KernelSource for Wgsl {
    fn source(&self) -> SourceTemplate {
        let common =
            SourceTemplate::new(self.text).register("common", include_str!("../../../../shaders/flash_common.wgsl"));
        self.values.iter().fold(common, |t, (k, v)| t.register(*k, v.as_str()))
    }
    fn id(&self) -> KernelId {
        KernelId::new::<Self>().info((self.name, self.values.clone()))
    }
    fn lang(&self) -> &'static str {
        "wgsl"
    }
}

/// The decoding kernel's workgroup copy of a query row: D rounded up to a power of two, at least 32.
fn dmax(d: usize) -> u32 {
    (d.next_power_of_two() as u32).max(32)
}

/// Launches `kernel` with the tensors bound in order and the info words bound last.
fn launch(like: &CubeTensor, kernel: Wgsl, threads: u32, count: (u32, u32), tensors: &[&CubeTensor], info: &[u32]) {
    launch_with_info_at(like, kernel, threads, count, tensors, tensors.len(), info);
}

/// The same with the info words bound at binding `at` and the tensors around it, in order.
fn launch_with_info_at(
    like: &CubeTensor,
    kernel: Wgsl,
    threads: u32,
    count: (u32, u32),
    tensors: &[&CubeTensor],
    at: usize,
    info: &[u32],
) {
    let bytes: Vec<u8> = info.iter().flat_map(|w| w.to_le_bytes()).collect();
    let info = like.client.create_from_slice(&bytes);
    let mut buffers: Vec<_> = tensors.iter().map(|t| t.handle.clone().binding()).collect();
    buffers.insert(at, info.binding());
    like.client.launch(
        Box::new(SourceKernel::new(kernel, CubeDim::new_1d(threads))),
        CubeCount::Static(count.0, count.1, 1),
        KernelArguments::new().with_buffers(buffers),
    );
}

fn empty(like: &CubeTensor, dims: &[usize]) -> CubeTensor {
    let shape = Shape::from(dims.to_vec());
    let handle = like.client.empty(shape.num_elements().max(1) * DType::F32.size());
    CubeTensor::new_contiguous(like.client.clone(), like.device.clone(), shape, handle, DType::F32)
}

fn f32_contiguous(t: CubeTensor) -> CubeTensor {
    assert_eq!(t.dtype, DType::F32, "the WGSL attention kernels take f32 tensors");
    into_contiguous(t)
}

/// The `info` words every kernel reads (layout in `flash_common.wgsl`), for queries q and Hkv KV heads.
fn info(params: &FlashParams, q: &Shape, hkv: usize, tk: usize) -> Vec<u32> {
    let (b, hq, tq, d) = (q[0], q[1], q[2], q[3]);
    let page = match &params.layout {
        KvLayout::Paged(p) => p.page_size,
        _ => 0,
    };
    let splits = tk.div_ceil(SPLIT).max(1);
    let mut words = vec![
        b as u32,
        hq as u32,
        hkv as u32,
        tq as u32,
        tk as u32,
        d as u32,
        params.scale.to_bits(),
        params.causal as u32,
        params.query_offset as u32,
        params.window as u32,
        SPLIT as u32,
        splits as u32,
        page as u32,
    ];
    words.extend((0..b).map(|r| params.key_lengths.get(r).map_or(tk, |&l| l.min(tk)) as u32));
    if let KvLayout::Paged(p) = &params.layout {
        let per_row = tk.div_ceil(p.page_size);
        for row in &p.table {
            words.extend((0..per_row).map(|i| row.get(i).copied().unwrap_or(0) as u32));
        }
    }
    words
}

const DECODE_F32: &str = include_str!("../../../../shaders/flash_kv_f32.wgsl");
const DECODE_INT8: &str = include_str!("../../../../shaders/flash_kv_int8.wgsl");

/// Flash-decoding: the split kernel reading keys and values through `kv_source` (WGSL binding `kv` from 5 on), then
/// the merge into o and lse.
fn decode(q: &CubeTensor, kv_source: String, kv: &[&CubeTensor], words: &[u32], o: &CubeTensor, lse: &CubeTensor) {
    let (rows, d, splits) = ((words[0] * words[1] * words[3]) as usize, words[5] as usize, words[11] as usize);
    let (part_m, part_l) = (empty(q, &[rows, splits]), empty(q, &[rows, splits]));
    let part_u = empty(q, &[rows, splits, d]);
    let dmax = dmax(d);
    let values = vec![
        ("kv_source", kv_source),
        ("workgroup", DECODE_WG.to_string()),
        ("dmax", dmax.to_string()),
        ("slots", dmax.div_ceil(DECODE_WG).to_string()),
    ];
    let split = Wgsl { name: "flash_decode", text: include_str!("../../../../shaders/flash_decode.wgsl"), values };
    let reduce = Wgsl {
        name: "flash_decode_reduce",
        text: include_str!("../../../../shaders/flash_decode_reduce.wgsl"),
        values: vec![("workgroup", DECODE_WG.to_string())],
    };
    let mut tensors = vec![q, &part_m, &part_l, &part_u];
    tensors.extend(kv);
    launch_with_info_at(q, split, DECODE_WG, (splits as u32, rows as u32), &tensors, 4, words);
    launch(q, reduce, DECODE_WG, (rows as u32, 1), &[&part_m, &part_l, &part_u, o, lse], words);
}

impl FlashOps for CubeBackend {
    fn flash_forward(q: CubeTensor, k: CubeTensor, v: CubeTensor, params: FlashParams) -> (CubeTensor, CubeTensor) {
        let (q, k, v) = (f32_contiguous(q), f32_contiguous(k), f32_contiguous(v));
        let (qs, ks) = (q.meta.shape().clone(), k.meta.shape().clone());
        let (b, hq, tq, d) = (qs[0], qs[1], qs[2], qs[3]);
        assert!(hq % ks[1] == 0, "query heads ({hq}) must be a multiple of KV heads ({})", ks[1]);
        let o = empty(&q, &[b, hq, tq, d]);
        let lse = empty(&q, &[b, hq, tq]);
        if b * hq * tq == 0 {
            return (o, lse);
        }
        if let KvLayout::Paged(p) = &params.layout {
            let words = info(&params, &qs, ks[1], p.keys);
            decode(&q, DECODE_F32.into(), &[&k, &v], &words, &o, &lse);
        } else if tq <= DECODE_ROWS {
            decode(&q, DECODE_F32.into(), &[&k, &v], &info(&params, &qs, ks[1], ks[2]), &o, &lse);
        } else {
            let workgroup_bytes = q.client.properties().hardware.max_shared_memory_size;
            let geometry = Geometry::queries(tier(&q, &params), d, workgroup_bytes);
            let text = include_str!("../../../../shaders/flash_forward.wgsl");
            let kernel = Wgsl { name: "flash_forward", text, values: geometry.forward() };
            let hkv = ks[1];
            let count = (((hq / hkv * tq) as u32).div_ceil(geometry.block()), (b * hkv) as u32);
            let words = info(&params, &qs, hkv, ks[2]);
            launch(&q, kernel, geometry.threads, count, &[&q, &k, &v, &o, &lse], &words);
        }
        (o, lse)
    }

    fn flash_decode_int8(
        q: CubeTensor,
        k_codes: CubeTensor,
        k_scales: CubeTensor,
        v_codes: CubeTensor,
        v_scales: CubeTensor,
        params: FlashParams,
    ) -> CubeTensor {
        let KvLayout::Int8 { group, keys } = params.layout else { panic!("int8 decoding takes an int8 layout") };
        let q = f32_contiguous(q);
        let (k_scales, v_scales) = (f32_contiguous(k_scales), f32_contiguous(v_scales));
        let (k_codes, v_codes) = (into_contiguous(k_codes), into_contiguous(v_codes));
        assert_eq!(k_codes.dtype.size(), 4, "int8 codes come packed in 32-bit words");
        let qs = q.meta.shape().clone();
        let (b, hq, tq, d) = (qs[0], qs[1], qs[2], qs[3]);
        let hkv = k_codes.meta.shape()[2] * 4 / d;
        let o = empty(&q, &[b, hq, tq, d]);
        let lse = empty(&q, &[b, hq, tq]);
        if b * hq * tq > 0 {
            let words = info(&params, &qs, hkv, keys);
            // The source is pasted into the kernel after its placeholders are filled: fill its own first.
            let source = DECODE_INT8.replace("{{ group }}", &group.to_string());
            decode(&q, source, &[&k_codes, &k_scales, &v_codes, &v_scales], &words, &o, &lse);
        }
        o
    }

    fn flash_backward(
        q: CubeTensor,
        k: CubeTensor,
        v: CubeTensor,
        d_o: CubeTensor,
        lse: CubeTensor,
        delta: CubeTensor,
        params: FlashParams,
    ) -> (CubeTensor, CubeTensor, CubeTensor) {
        let (q, k, v) = (f32_contiguous(q), f32_contiguous(k), f32_contiguous(v));
        let (d_o, lse, delta) = (f32_contiguous(d_o), f32_contiguous(lse), f32_contiguous(delta));
        let (qs, ks) = (q.meta.shape().clone(), k.meta.shape().clone());
        let (b, hq, tq, d) = (qs[0], qs[1], qs[2], qs[3]);
        let (hkv, tk) = (ks[1], ks[2]);
        let dq = empty(&q, &[b, hq, tq, d]);
        let dk = empty(&q, &[b, hkv, tk, d]);
        let dv = empty(&q, &[b, hkv, tk, d]);
        let words = info(&params, &qs, hkv, tk);
        let workgroup_bytes = q.client.properties().hardware.max_shared_memory_size;
        let tier = tier(&q, &params);
        if b * hq * tq > 0 {
            let geometry = Geometry::queries(tier, d, workgroup_bytes);
            let text = include_str!("../../../../shaders/flash_backward_dq.wgsl");
            let kernel = Wgsl { name: "flash_backward_dq", text, values: geometry.dq() };
            let count = (((hq / hkv * tq) as u32).div_ceil(geometry.block()), (b * hkv) as u32);
            launch(&q, kernel, geometry.threads, count, &[&q, &k, &v, &d_o, &lse, &delta, &dq], &words);
        }
        if b * hkv * tk > 0 {
            let geometry = Geometry::keys(tier, d, workgroup_bytes);
            let text = include_str!("../../../../shaders/flash_backward_dkdv.wgsl");
            let kernel = Wgsl { name: "flash_backward_dkdv", text, values: geometry.dkdv() };
            let count = ((tk as u32).div_ceil(geometry.block()), (b * hkv) as u32);
            launch(&q, kernel, geometry.threads, count, &[&q, &k, &v, &d_o, &lse, &delta, &dk, &dv], &words);
        }
        (dq, dk, dv)
    }
}
