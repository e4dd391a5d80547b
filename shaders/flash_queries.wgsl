// The query side of FlashAttention: a workgroup takes a block of query rows and walks the keys they see, tile by tile.
// Two passes share this walk and differ in their per-row code (crates/kernels/src/flash/tiers.rs) and bindings:
// - forward: o = softmax(q kᵀ·scale + mask) v, exact, with the online softmax (flash_common.wgsl): a chunk of CHUNK
//   keys is scored at once, then m, ℓ and u are rescaled once and u += Σ_j p_j v_j. At the end o = u / ℓ and
//   lse = m + ln ℓ (saved for the backward pass); a row that sees no key gives o = 0. When the grid is small,
//   workgroup z takes only split z of the keys and writes its partial (m, ℓ, u); the decoding merge kernel
//   (flash_decode_reduce.wgsl) then combines the splits into o and lse.
// - backward dq (FlashAttention-2): p_ij = e^(s_ij − lse_i) recomputed chunk by chunk, dp_ij = dO_i · v_j,
//   ds_ij = p_ij (dp_ij − D_i) with D_i = rowsum(dO_i ⊙ o_i), dq_i = scale · Σ_j ds_ij k_j. No T×T buffer. Launched
//   only where dq is not folded into the dk/dv pass (adapters without f32 atomics).
// Rows: a workgroup takes BLOCK rows of one (batch, KV head), its GQA group's query heads packed head-minor (row
// n = t·g + r for query head r of the g in the group), so they share one K/V stream. A group of LANES lanes owns
// ROWS rows; lane λ holds the vec4s x·LANES + λ of each row's q and u, so a score is LANES partial dot products summed
// by subgroup shuffles (LANES = 1: one lane per row, no subgroup operations: the portable tier).
// K and V tiles in workgroup memory; tiles and chunks no row can see (above the causal diagonal, before the window,
// past the key length) are skipped. Causal blocks run longest first.
// The per-row code is unrolled at build time (the placeholders): llvmpipe stops an invocation after 65,535 loop
// iterations in all, and private arrays indexed at run time would live in memory rather than registers.
// K and V tiles hold `Shared`, q, k, v and o are `Elem` in memory, all arithmetic is f32; with f16 tiles q is rounded
// to f16 as well, so that every pass computes attention of the same rounded q, k and v.
// Bindings are all read_write: cubecl sub-allocates tensors from shared buffers, which may alias.

{{ types }}

@group(0) @binding(0) var<storage, read_write> q: array<vec4<Elem>>;   // [B, Hq, Tq, D]
@group(0) @binding(1) var<storage, read_write> k: array<vec4<Elem>>;   // [B, Hkv, Tk, D]
@group(0) @binding(2) var<storage, read_write> v: array<vec4<Elem>>;   // [B, Hkv, Tk, D]
// The pass's own: o and lse (or a split's partial states), or dO, lse, D and dq; then info.
{{ bindings }}

{{ common }}

// LANES, ROWS, THREADS, BLOCK, TILE, CHUNK, V: the tier's layout (tiers.rs `Geometry`).
{{ geometry }}

var<workgroup> k_tile: array<vec4<Shared>, {{ tile_vec4s }}>;
var<workgroup> v_tile: array<vec4<Shared>, {{ tile_vec4s }}>;
var<workgroup> block_keys: vec2<u32>;
{{ exchange_memory }}

@compute @workgroup_size({{ threads }}, 1, 1)
fn main(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let c = call();
    let b = wg.y / c.hkv;
    let kvh = wg.y % c.hkv;
    let rows = packed_rows(c);
    let blocks = (rows + BLOCK - 1u) / BLOCK;
    let n0 = select(wg.x, blocks - 1u - wg.x, c.causal) * BLOCK;
    let lane = lid % LANES;
    let first = n0 + lid / LANES * ROWS;
    if (lid == 0u) {
        let last = min(n0 + BLOCK, rows) - 1u;
        block_keys = keys_seen(c, b, kvh, n0, last);
        {{ split_keys }}
    }
    let keys = workgroupUniformLoad(&block_keys);
    let kv = (b * c.hkv + kvh) * c.tk * V;

    {{ row_setup }}

    for (var t0 = keys.x; t0 < keys.y; t0 += TILE) {
        let n = min(TILE, keys.y - t0);
        // The tile's tail is zeroed: masked keys then add 0 · 0.
        for (var idx = lid; idx < TILE * V; idx += THREADS) {
            let e = kv + t0 * V + min(idx, n * V - 1u);
            k_tile[idx] = select(vec4<Shared>(0.0), vec4<Shared>(k[e]), idx < n * V);
            v_tile[idx] = select(vec4<Shared>(0.0), vec4<Shared>(v[e]), idx < n * V);
        }
        workgroupBarrier();
        // Chunks the group's rows see; the group's lanes share them, so its shuffles run together.
        let c_hi = min(max(hi, t0), t0 + n) - t0;
        for (var j0 = (max(lo, t0) - t0) / CHUNK * CHUNK; j0 < c_hi; j0 += CHUNK) {
            let jv = vec4<u32>(t0 + j0) + vec4<u32>(0u, 1u, 2u, 3u);
            {{ chunk_code }}
        }
        workgroupBarrier();
    }

    {{ row_finish }}
}
