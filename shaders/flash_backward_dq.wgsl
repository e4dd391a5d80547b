// FlashAttention-2 backward, queries: recompute p_ij = exp(s_ij − lse_i) chunk by chunk, dp_ij = dO_i · v_j,
// ds_ij = p_ij (dp_ij − D_i) with D_i = rowsum(dO_i ⊙ o_i), and dq_i = scale · Σ_j ds_ij k_j. No T×T buffer.
// The forward's layout (flash_forward.wgsl): packed GQA rows, groups of LANES lanes owning ROWS rows, K and V tiles
// in workgroup memory, per-row code unrolled at build time. Launched only where dq is not folded into the dk/dv pass
// (adapters without f32 atomics, or `AttentionImpl::FoldDq(_, false)`).

{{ types }}

@group(0) @binding(0) var<storage, read_write> q: array<vec4<Elem>>;     // [B, Hq, Tq, D]
@group(0) @binding(1) var<storage, read_write> k: array<vec4<Elem>>;     // [B, Hkv, Tk, D]
@group(0) @binding(2) var<storage, read_write> v: array<vec4<Elem>>;     // [B, Hkv, Tk, D]
@group(0) @binding(3) var<storage, read_write> d_o: array<vec4<Elem>>;   // [B, Hq, Tq, D]
@group(0) @binding(4) var<storage, read_write> lse: array<f32>;         // [B, Hq, Tq]
@group(0) @binding(5) var<storage, read_write> delta: array<f32>;       // [B, Hq, Tq]: D_i
@group(0) @binding(6) var<storage, read_write> dq: array<vec4<Elem>>;    // [B, Hq, Tq, D]
@group(0) @binding(7) var<storage, read_write> info: array<u32>;

{{ common }}

const LANES: u32 = {{ lanes }}u;
const ROWS: u32 = {{ rows }}u;
const THREADS: u32 = {{ threads }}u;
const BLOCK: u32 = {{ block }}u;
const TILE: u32 = {{ tile }}u;
const CHUNK: u32 = {{ chunk }}u;
const V: u32 = {{ vec4s }}u;

var<workgroup> k_tile: array<vec4<Shared>, {{ tile_vec4s }}>;
var<workgroup> v_tile: array<vec4<Shared>, {{ tile_vec4s }}>;
var<workgroup> block_keys: vec2<u32>;
{{ exchange_memory }}

@compute @workgroup_size({{ threads }}, 1, 1)
fn main(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let c = call();
    let b = wg.y / c.hkv;
    let kvh = wg.y % c.hkv;
    let rows = (c.hq / c.hkv) * c.tq;
    let blocks = (rows + BLOCK - 1u) / BLOCK;
    let n0 = select(wg.x, blocks - 1u - wg.x, c.causal) * BLOCK;
    let lane = lid % LANES;
    let first = n0 + lid / LANES * ROWS;
    if (lid == 0u) {
        let last = min(n0 + BLOCK, rows) - 1u;
        block_keys = vec2<u32>(row_keys(c, b, packed_row(c, b, kvh, n0).y).x,
                               row_keys(c, b, packed_row(c, b, kvh, last).y).y);
    }
    let keys = workgroupUniformLoad(&block_keys);
    let kv = (b * c.hkv + kvh) * c.tk * V;

    {{ row_setup }}

    for (var t0 = keys.x; t0 < keys.y; t0 += TILE) {
        let n = min(TILE, keys.y - t0);
        for (var idx = lid; idx < TILE * V; idx += THREADS) {
            let e = kv + t0 * V + min(idx, n * V - 1u);
            k_tile[idx] = select(vec4<Shared>(0.0), vec4<Shared>(k[e]), idx < n * V);
            v_tile[idx] = select(vec4<Shared>(0.0), vec4<Shared>(v[e]), idx < n * V);
        }
        workgroupBarrier();
        let c_hi = min(max(hi, t0), t0 + n) - t0;
        for (var j0 = (max(lo, t0) - t0) / CHUNK * CHUNK; j0 < c_hi; j0 += CHUNK) {
            let jv = vec4<u32>(t0 + j0) + vec4<u32>(0u, 1u, 2u, 3u);
            {{ chunk_code }}
        }
        workgroupBarrier();
    }

    {{ row_finish }}
}
