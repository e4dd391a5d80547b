//! Launching the WGSL kernels on CubeCL wgpu tensors.

use burn::backend::ops::FloatTensorOps;
use burn::backend::wgpu::{CubeBackend, CubeTensor, into_contiguous};
use burn::cubecl::features::{AtomicUsage, Plane};
use burn::cubecl::ir::{ElemType, FloatKind, Type};
use burn::tensor::{DType, FloatDType, Shape};

use super::tiers::Geometry;
use super::{DECODE_ROWS, FlashGradOps, FlashOps, FlashParams, Int8AttentionOps, KvLayout};
use crate::spec::KernelTier;
use crate::wgsl::{Wgsl, empty, f32_contiguous, launch, launch_with_info_at};

/// Invocations of a flash-decoding workgroup, and of a merge workgroup (one per vec4 of a row of up to 256).
const DECODE_WG: u32 = 128;
const REDUCE_WG: u32 = 64;
/// Workgroups to aim for when splitting keys (decoding, small forward grids): four per SM of a 132-SM GPU (an H200).
const FILL_WORKGROUPS: usize = 4 * 132;
/// Keys per split of the tiled forward when its grid is too small to fill the GPU, at least.
const SPLIT_KEYS: usize = 512;
/// Keys per split: at least SPLIT_MIN (unless the cache is shorter), at most SPLIT_MAX (tiles of ≥ 4 keys keep a
/// split's tile loop within llvmpipe's 65,535 iterations).
const SPLIT_MIN: usize = 64;
const SPLIT_MAX: usize = 16384;
/// Query rows per decoding workgroup at most, and the workgroup memory its q rows may take.
const DECODE_ROWS_MAX: usize = 16;
const DECODE_Q_BYTES: usize = 6144;
/// WebGPU's portable workgroup memory, which the decoding kernel stays within.
const DECODE_BYTES: usize = 16384;

/// The tier `params` forces, else the adapter's best: subgroups where cubecl reports them (it does not on CPU
/// adapters such as lavapipe, though the device has them) and their size holds a group of lanes.
fn tier(like: &CubeTensor, params: &FlashParams) -> KernelTier {
    let properties = like.client.properties();
    let subgroups = properties.features.plane.contains(Plane::Ops) && properties.hardware.plane_size_min >= 8;
    params.tuning.tier.unwrap_or(if subgroups { KernelTier::Subgroup } else { KernelTier::Portable })
}

/// Whether the backward folds dq into the dk/dv pass: as `params` forces, else where the adapter adds f32 atomically
/// (wgpu `SHADER_FLOAT32_ATOMIC`).
fn fold_dq(like: &CubeTensor, params: &FlashParams) -> bool {
    let f32_atomic = Type::atomic(ElemType::Float(FloatKind::F32));
    let atomic_add = like.client.properties().atomic_type_usage(f32_atomic).contains(AtomicUsage::Add);
    let fold = params.tuning.fold_dq.unwrap_or(atomic_add);
    assert!(atomic_add || !fold, "folding dq into the dk/dv pass needs f32 atomics (wgpu SHADER_FLOAT32_ATOMIC)");
    fold
}

/// Whether the tiles in workgroup memory hold f16: as `params` forces, else where the inputs (of dtype `elem`) are
/// f16.
fn half_tiles(like: &CubeTensor, params: &FlashParams, elem: DType) -> bool {
    let half = params.tuning.half_tiles(elem == DType::F16);
    let f16 = like.client.properties().supports_type(ElemType::Float(FloatKind::F16));
    assert!(f16 || !(half || elem == DType::F16), "f16 attention needs an adapter with wgpu SHADER_F16");
    half
}

/// The `types` placeholder: `Elem`, the element of q, k, v, o and their gradients in memory, and `Shared`, that of
/// the tiles in workgroup memory (with `enable f16` where either is f16).
fn types(elem: DType, half: bool) -> String {
    let name = |f16: bool| if f16 { "f16" } else { "f32" };
    let f16 = elem == DType::F16;
    let enable = if f16 || half { "enable f16;\n" } else { "" };
    format!("{enable}alias Elem = {};\nalias Shared = {};", name(f16), name(half))
}

/// Bytes of a value in workgroup tiles: 2 for f16, else 4.
fn shared_bytes(half: bool) -> usize {
    if half { 2 } else { 4 }
}

const QUERIES: &str = include_str!("../../../../shaders/flash_queries.wgsl");
const KEYS: &str = include_str!("../../../../shaders/flash_backward_dkdv.wgsl");

/// The tiled passes of attention: a block of query rows walking the keys (the forward, whole or one split of the
/// keys, and dq), or a block of key rows walking the queries (dk and dv, and dq where it is folded in).
#[derive(Clone, Copy, Debug)]
enum Pass {
    Forward { split: bool },
    Dq,
    DkDv,
}

impl Pass {
    /// The pass's kernel in `geometry`'s layout over inputs of `elem` (`half`: f16 tiles).
    fn kernel(self, geometry: &Geometry, elem: DType, half: bool) -> Wgsl {
        let (name, text, mut values) = match self {
            Pass::Forward { split } => ("flash_forward", QUERIES, geometry.forward(split)),
            Pass::Dq => ("flash_backward_dq", QUERIES, geometry.dq()),
            Pass::DkDv => ("flash_backward_dkdv", KEYS, geometry.dkdv()),
        };
        values.push(("types", types(elem, half)));
        Wgsl { name, text, values }
    }
}

/// The forward on n×n cooperative matrices (flash_forward_coop.wgsl) for head width `d`, a multiple of n, in
/// workgroups of one subgroup of `threads` ≥ n invocations, over inputs of `elem`.
fn cooperative_forward(n: u32, d: usize, threads: u32, elem: DType) -> Wgsl {
    assert!(n == 8 || n == 16, "cooperative matrices of side {n}: WGSL has 8×8 and 16×16");
    assert!(
        d.is_multiple_of(n as usize),
        "the {n}×{n} cooperative forward takes head widths that are multiples of {n}, not {d}"
    );
    assert!(threads >= n, "the {n}×{n} cooperative forward needs subgroups of at least {n} lanes, not {threads}");
    let values = vec![
        ("threads", threads.to_string()),
        ("n", n.to_string()),
        ("nn", (n * n).to_string()),
        ("mat", format!("coop_mat{n}x{n}")),
        ("d", d.to_string()),
        ("tile", (n as usize * d).to_string()),
        ("types", types(elem, true)),
    ];
    Wgsl { name: "flash_forward_coop", text: include_str!("../../../../shaders/flash_forward_coop.wgsl"), values }
}

/// The decoding kernel's layout for head width d and `packed` query rows per (batch row, KV head) (its GQA group's
/// heads × Tq): blocks of `rows` query rows, tiles of `tile` keys, rows `stride` vec4s long in workgroup memory (V
/// rounded up to odd: no bank conflicts across rows; K and V at `shared` bytes a value), each score split over
/// `dot_parts` invocations and each vec4 of u over `key_parts`.
#[derive(Clone, Copy, Debug)]
struct DecodeGeometry {
    rows: usize,
    blocks: usize,
    tile: usize,
    vec4s: usize,
    stride: usize,
    dot_parts: usize,
    key_parts: usize,
}

impl DecodeGeometry {
    fn new(d: usize, packed: usize, shared: usize) -> Self {
        let (wg, packed) = (DECODE_WG as usize, packed.max(1));
        let vec4s = (d / 4).max(1);
        let stride = vec4s | 1;
        let row_bytes = 16 * stride;
        // Rows: as many as fit, split evenly over the fewest blocks.
        let most = (DECODE_Q_BYTES / row_bytes).clamp(1, DECODE_ROWS_MAX);
        let rows = packed.div_ceil(packed.div_ceil(most));
        let blocks = packed.div_ceil(rows);
        let key_parts = (wg / vec4s).max(1);
        let dot_parts = |tile: usize| (wg / (rows * tile)).clamp(1, vec4s);
        // Workgroup memory with `tile` keys: q, K and V rows; slices, scores, ranges and rescales (4-byte words, each
        // variable rounded up to 16 bytes, its possible alignment); the split's range.
        let bytes = |tile: usize| {
            let words = [rows * tile * dot_parts(tile), rows * tile, 2 * rows, rows];
            let rows_bytes = 16 * stride * rows + 2 * 4 * shared * stride * tile;
            rows_bytes + words.map(|n| (4 * n).next_multiple_of(16)).iter().sum::<usize>() + 16
        };
        let mut tile = (1..=32).rev().find(|&t| bytes(t) <= DECODE_BYTES).unwrap_or(1);
        // Whole rounds of the key parts, where the tile holds one.
        if tile >= key_parts {
            tile -= tile % key_parts;
        }
        Self { rows, blocks, tile, vec4s, stride, dot_parts: dot_parts(tile), key_parts }
    }

    /// The decoding kernel (flash_decode.wgsl) reading keys and values through `kv_source`, over q of `elem`
    /// (`half`: f16 tiles).
    fn kernel(&self, kv_source: String, elem: DType, half: bool) -> Wgsl {
        let mut values = self.values();
        values.extend([("kv_source", kv_source), ("types", types(elem, half))]);
        Wgsl { name: "flash_decode", text: include_str!("../../../../shaders/flash_decode.wgsl"), values }
    }

    /// The decoding kernel's placeholders.
    fn values(&self) -> Vec<(&'static str, String)> {
        let slices = self.rows * self.tile * self.dot_parts;
        [
            ("workgroup", DECODE_WG as usize),
            ("rows", self.rows),
            ("tile", self.tile),
            ("vec4s", self.vec4s),
            ("stride", self.stride),
            ("dot_parts", self.dot_parts),
            ("key_parts", self.key_parts),
            ("row_vec4s", self.rows * self.stride),
            ("tile_vec4s", self.tile * self.stride),
            ("slice_count", slices),
            ("score_count", self.rows * self.tile),
        ]
        .into_iter()
        .map(|(k, v)| (k, v.to_string()))
        .collect()
    }
}

/// q, k, v (or dO) contiguous, all f32 or all f16; their dtype.
fn float_contiguous<const N: usize>(tensors: [CubeTensor; N]) -> ([CubeTensor; N], DType) {
    let dtype = tensors[0].dtype;
    assert!(
        tensors.iter().all(|t| t.dtype == dtype) && matches!(dtype, DType::F32 | DType::F16),
        "the WGSL attention kernels take q, k and v all f32 or all f16"
    );
    (tensors.map(into_contiguous), dtype)
}

/// The `info` words every kernel reads (layout in `flash_common.wgsl`), for queries q and Hkv KV heads.
fn info(params: &FlashParams, q: &Shape, hkv: usize, tk: usize) -> Vec<u32> {
    let (b, hq, tq, d) = (q[0], q[1], q[2], q[3]);
    let page = match &params.layout {
        KvLayout::Paged(p) => p.page_size,
        _ => 0,
    };
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
        0, // split and splits: set by a launch that splits the keys (`split_keys`)
        0,
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

const DECODE_FLOAT: &str = include_str!("../../../../shaders/flash_kv_float.wgsl");
const DECODE_INT8: &str = include_str!("../../../../shaders/flash_kv_int8.wgsl");

/// The int8 cache's source for groups of `group` values per scale. It is pasted into the kernel after the kernel's
/// placeholders are filled: its own are filled first.
fn int8_source(group: usize) -> String {
    DECODE_INT8.replace("{{ group }}", &group.to_string())
}

/// Cuts the tk keys into about `splits` splits of equal length (at least one key each) and records the split length
/// and the count in the info words; returns the count.
fn split_keys(words: &mut [u32], tk: usize, splits: usize) -> usize {
    let split = tk.div_ceil(splits.max(1)).max(1);
    let splits = tk.div_ceil(split).max(1);
    (words[10], words[11]) = (split as u32, splits as u32);
    splits
}

/// Flash-decoding: the split kernel reading keys and values through `kv_source` (WGSL binding `kv` from 5 on), a
/// workgroup per (split, (batch row, KV head, block of its GQA group's query rows)), then the merge into o and lse, a
/// workgroup per query row. `half`: K and V tiles in f16.
fn decode(q: &CubeTensor, kv_source: String, kv: &[&CubeTensor], words: Vec<u32>, half: bool, out: [&CubeTensor; 2]) {
    let mut words = words;
    let [b, hq, hkv, tq, tk, d] = [0usize, 1, 2, 3, 4, 5].map(|i| words[i] as usize);
    let geometry = DecodeGeometry::new(d, hq / hkv * tq, shared_bytes(half));
    // Splits: enough for FILL_WORKGROUPS workgroups over the (batch row, KV head, row block)s, within SPLIT_MIN and
    // SPLIT_MAX keys each.
    let wanted = FILL_WORKGROUPS.div_ceil(b * hkv * geometry.blocks);
    let splits = split_keys(&mut words, tk, wanted.min(tk / SPLIT_MIN).max(tk.div_ceil(SPLIT_MAX)));
    let rows = b * hq * tq;
    let parts = partial_states(q, rows, splits, d);
    let split = geometry.kernel(kv_source, q.dtype, half);
    let mut tensors = vec![q, &parts[0], &parts[1], &parts[2]];
    tensors.extend(kv);
    let count = (splits as u32, (b * hkv * geometry.blocks) as u32);
    launch_with_info_at(q, split, DECODE_WG, [count.0, count.1, 1], &tensors, 4, &words);
    merge(q, &words, parts, out);
}

/// The merge kernel (flash_decode_reduce.wgsl) writing o of `elem`.
fn merge_kernel(elem: DType) -> Wgsl {
    let values = vec![("workgroup", REDUCE_WG.to_string()), ("types", types(elem, false))];
    Wgsl { name: "flash_decode_reduce", text: include_str!("../../../../shaders/flash_decode_reduce.wgsl"), values }
}

/// Split partial states of `rows` query rows: m and ℓ [rows, splits], u [rows, splits, d], all f32.
fn partial_states(like: &CubeTensor, rows: usize, splits: usize, d: usize) -> [CubeTensor; 3] {
    [&[rows, splits][..], &[rows, splits], &[rows, splits, d]].map(|dims| empty(like, dims, DType::F32))
}

/// The merge of split partial states [rows, splits] (m, ℓ, and u with D per entry) into o (of o's dtype) and lse, a
/// workgroup per query row.
fn merge(q: &CubeTensor, words: &[u32], parts: [CubeTensor; 3], [o, lse]: [&CubeTensor; 2]) {
    let rows = (words[0] * words[1] * words[3]) as usize;
    let reduce = merge_kernel(o.dtype);
    // Rows past the grid's 65,535 per dimension wrap into y (the merge kernel's row = x + y · min(rows, 65,535)).
    let across = rows.min(65535);
    let count = (across as u32, rows.div_ceil(across) as u32);
    let [part_m, part_l, part_u] = &parts;
    launch(q, reduce, REDUCE_WG, count, &[part_m, part_l, part_u, o, lse], words);
}

impl FlashOps for CubeBackend {
    fn flash_forward(q: CubeTensor, k: CubeTensor, v: CubeTensor, params: FlashParams) -> (CubeTensor, CubeTensor) {
        let ([q, k, v], dtype) = float_contiguous([q, k, v]);
        let half = half_tiles(&q, &params, dtype);
        let (qs, ks) = (q.meta.shape().clone(), k.meta.shape().clone());
        let (b, hq, tq, d) = (qs[0], qs[1], qs[2], qs[3]);
        assert!(hq % ks[1] == 0, "query heads ({hq}) must be a multiple of KV heads ({})", ks[1]);
        let o = empty(&q, &[b, hq, tq, d], dtype);
        let lse = empty(&q, &[b, hq, tq], DType::F32);
        if b * hq * tq == 0 {
            return (o, lse);
        }
        if let KvLayout::Paged(p) = &params.layout {
            let words = info(&params, &qs, ks[1], p.keys);
            decode(&q, DECODE_FLOAT.into(), &[&k, &v], words, half, [&o, &lse]);
        } else if tq <= DECODE_ROWS {
            decode(&q, DECODE_FLOAT.into(), &[&k, &v], info(&params, &qs, ks[1], ks[2]), half, [&o, &lse]);
        } else if let Some(n) = params.tuning.cooperative {
            let (hkv, tk) = (ks[1], ks[2]);
            let threads = q.client.properties().hardware.plane_size_max;
            let kernel = cooperative_forward(n, d, threads, dtype);
            let count = (((hq / hkv * tq) as u32).div_ceil(n), (b * hkv) as u32);
            launch(&q, kernel, threads, count, &[&q, &k, &v, &o, &lse], &info(&params, &qs, hkv, tk));
        } else {
            let workgroup_bytes = q.client.properties().hardware.max_shared_memory_size;
            let geometry = Geometry::queries(tier(&q, &params), d, shared_bytes(half), workgroup_bytes);
            let (hkv, tk) = (ks[1], ks[2]);
            let count = (((hq / hkv * tq) as u32).div_ceil(geometry.block()), (b * hkv) as u32);
            let mut words = info(&params, &qs, hkv, tk);
            // Too few workgroups to fill a large GPU: split the keys too, at least SPLIT_KEYS each, and merge.
            let workgroups = (count.0 * count.1) as usize;
            let splits = FILL_WORKGROUPS.div_ceil(workgroups).min(tk / SPLIT_KEYS);
            let kernel = Pass::Forward { split: splits > 1 }.kernel(&geometry, dtype, half);
            if splits > 1 {
                let splits = split_keys(&mut words, tk, splits);
                let parts = partial_states(&q, b * hq * tq, splits, d);
                let tensors = [&q, &k, &v, &parts[0], &parts[1], &parts[2]];
                let grid = [count.0, count.1, splits as u32];
                launch_with_info_at(&q, kernel, geometry.threads, grid, &tensors, tensors.len(), &words);
                merge(&q, &words, parts, [&o, &lse]);
            } else {
                launch(&q, kernel, geometry.threads, count, &[&q, &k, &v, &o, &lse], &words);
            }
        }
        (o, lse)
    }
}

impl Int8AttentionOps for CubeBackend {
    fn flash_decode_int8(
        q: CubeTensor,
        k_codes: CubeTensor,
        k_scales: CubeTensor,
        v_codes: CubeTensor,
        v_scales: CubeTensor,
        params: FlashParams,
    ) -> CubeTensor {
        let KvLayout::Int8 { group, keys } = params.layout else { panic!("int8 decoding takes an int8 layout") };
        let ([q], dtype) = float_contiguous([q]);
        let half = half_tiles(&q, &params, dtype);
        let (k_scales, v_scales) = (f32_contiguous(k_scales), f32_contiguous(v_scales));
        let (k_codes, v_codes) = (into_contiguous(k_codes), into_contiguous(v_codes));
        assert_eq!(k_codes.dtype.size(), 4, "int8 codes come packed in 32-bit words");
        let qs = q.meta.shape().clone();
        let (b, hq, tq, d) = (qs[0], qs[1], qs[2], qs[3]);
        let hkv = k_codes.meta.shape()[2] * 4 / d;
        let o = empty(&q, &[b, hq, tq, d], dtype);
        let lse = empty(&q, &[b, hq, tq], DType::F32);
        if b * hq * tq > 0 {
            let words = info(&params, &qs, hkv, keys);
            let source = int8_source(group);
            decode(&q, source, &[&k_codes, &k_scales, &v_codes, &v_scales], words, half, [&o, &lse]);
        }
        o
    }
}

impl FlashGradOps for CubeBackend {
    fn flash_backward(
        q: CubeTensor,
        k: CubeTensor,
        v: CubeTensor,
        d_o: CubeTensor,
        lse: CubeTensor,
        delta: CubeTensor,
        params: FlashParams,
    ) -> (CubeTensor, CubeTensor, CubeTensor) {
        let ([q, k, v, d_o], dtype) = float_contiguous([q, k, v, d_o]);
        let (lse, delta) = (f32_contiguous(lse), f32_contiguous(delta));
        let half = half_tiles(&q, &params, dtype);
        let (qs, ks) = (q.meta.shape().clone(), k.meta.shape().clone());
        let (b, hq, tq, d) = (qs[0], qs[1], qs[2], qs[3]);
        let (hkv, tk) = (ks[1], ks[2]);
        let fold = fold_dq(&q, &params);
        // Folded, the dk/dv pass adds into dq, f32 zeros first.
        let dq = if fold && b * hq * tq > 0 {
            let zeros = CubeBackend::float_zeros(Shape::from(vec![b, hq, tq, d]), &q.device, FloatDType::F32);
            into_contiguous(zeros)
        } else {
            empty(&q, &[b, hq, tq, d], dtype)
        };
        let dk = empty(&q, &[b, hkv, tk, d], dtype);
        let dv = empty(&q, &[b, hkv, tk, d], dtype);
        let words = info(&params, &qs, hkv, tk);
        let workgroup_bytes = q.client.properties().hardware.max_shared_memory_size;
        let (tier, shared) = (tier(&q, &params), shared_bytes(half));
        if b * hq * tq > 0 && !fold {
            let geometry = Geometry::queries(tier, d, shared, workgroup_bytes);
            let kernel = Pass::Dq.kernel(&geometry, dtype, half);
            let count = (((hq / hkv * tq) as u32).div_ceil(geometry.block()), (b * hkv) as u32);
            launch(&q, kernel, geometry.threads, count, &[&q, &k, &v, &d_o, &lse, &delta, &dq], &words);
        }
        if b * hkv * tk > 0 {
            let geometry = Geometry::keys(tier, d, shared + dtype.size(), workgroup_bytes, fold);
            let kernel = Pass::DkDv.kernel(&geometry, dtype, half);
            let count = ((tk as u32).div_ceil(geometry.block()), (b * hkv) as u32);
            let mut tensors = vec![&q, &k, &v, &d_o, &lse, &delta, &dk, &dv];
            if fold {
                tensors.push(&dq);
            }
            launch(&q, kernel, geometry.threads, count, &tensors, &words);
        }
        // dq accumulated atomically in f32 is handed back in the inputs' dtype.
        (CubeBackend::float_cast(dq, dtype.into()), dk, dv)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::wgpu::KernelSource;

    /// `source` parsed and validated by naga with `capabilities`, or the panic naming `what` and naga's message.
    fn validated(
        source: &str,
        capabilities: naga::valid::Capabilities,
        what: &str,
    ) -> (naga::Module, naga::valid::ModuleInfo) {
        let module =
            naga::front::wgsl::parse_str(source).unwrap_or_else(|e| panic!("{what}: {}", e.emit_to_string(source)));
        let info = naga::valid::Validator::new(naga::valid::ValidationFlags::all(), capabilities)
            .validate(&module)
            .unwrap_or_else(|e| panic!("{what}: {}", e.emit_to_string(source)));
        (module, info)
    }

    /// Every tiled and decoding kernel the launchers can build is valid WGSL: each pass in both tiers, with and
    /// without folded dq (both places for the K rows), f32 and f16 inputs, f32 and f16 tiles, head widths 32 to 256,
    /// the decoding kernel over float and int8 caches, and the merge. The wgpu tests run only the variants their
    /// adapter picks; this checks the generated code of the rest on any machine.
    #[test]
    fn every_generated_attention_kernel_is_valid_wgsl() {
        use naga::valid::Capabilities;
        let capabilities = Capabilities::SUBGROUP | Capabilities::SHADER_FLOAT16 | Capabilities::SHADER_FLOAT32_ATOMIC;
        let mut checked = 0;
        for tier in [KernelTier::Portable, KernelTier::Subgroup] {
            for d in [32, 64, 128, 256] {
                for (elem, half) in [(DType::F32, false), (DType::F32, true), (DType::F16, true)] {
                    let shared = shared_bytes(half);
                    let queries = Geometry::queries(tier, d, shared, 32768);
                    let passes = [Pass::Forward { split: false }, Pass::Forward { split: true }, Pass::Dq];
                    let mut kernels: Vec<Wgsl> = passes.iter().map(|pass| pass.kernel(&queries, elem, half)).collect();
                    // 16 KiB leaves the folded pass's K rows in the buffer at d = 256; 32 KiB keeps them shared.
                    for (bytes, fold) in [(16384, false), (16384, true), (32768, true)] {
                        let keys = Geometry::keys(tier, d, shared + elem.size(), bytes, fold);
                        kernels.push(Pass::DkDv.kernel(&keys, elem, half));
                    }
                    let decoding = DecodeGeometry::new(d, 8, shared);
                    kernels.push(decoding.kernel(DECODE_FLOAT.into(), elem, half));
                    kernels.push(decoding.kernel(int8_source(32), elem, half));
                    kernels.push(merge_kernel(elem));
                    for kernel in kernels {
                        let what = format!("{} {tier:?} d {d} {elem:?} half {half}", kernel.name);
                        validated(&kernel.source().complete(), capabilities, &what);
                        checked += 1;
                    }
                }
            }
        }
        assert_eq!(checked, 2 * 4 * 3 * 9);
    }

    /// The cooperative-matrix forward is valid WGSL for naga with its capabilities (wgpu's
    /// EXPERIMENTAL_COOPERATIVE_MATRIX and SHADER_F16) and compiles to SPIR-V, the form Vulkan drivers with
    /// VK_KHR_cooperative_matrix run, for both sides, every head width it takes and both input types, on any
    /// machine; crates/kernels/tests/flash.rs runs it where an adapter offers the matrices (Mesa 26's lavapipe
    /// included, through scripts/lavapipe-26.sh).
    #[test]
    fn cooperative_forward_is_valid_and_compiles_to_spir_v() {
        use naga::valid::Capabilities;
        let cases = [(16, 64, DType::F32), (16, 64, DType::F16), (16, 128, DType::F32), (16, 256, DType::F16)];
        for (n, d, elem) in cases.into_iter().chain([(8, 8, DType::F32), (8, 72, DType::F16)]) {
            let source = cooperative_forward(n, d, 32, elem).source().complete();
            let capabilities = Capabilities::COOPERATIVE_MATRIX | Capabilities::SHADER_FLOAT16;
            let (module, info) = validated(&source, capabilities, &format!("d {d}, {elem:?}"));
            let options = naga::back::spv::Options { lang_version: (1, 6), ..Default::default() };
            let words = naga::back::spv::write_vec(&module, &info, &options, None).expect("SPIR-V");
            assert!(words.len() > 100 && words[0] == 0x0723_0203, "a SPIR-V module starts with its magic number");
        }
    }
}
