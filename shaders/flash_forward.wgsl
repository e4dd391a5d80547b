// FlashAttention forward: o = softmax(q kᵀ·scale + mask) v, exact, by tiles of keys with the online softmax.
// Per query row keep the running maximum m, ℓ = Σ e^(s_j − m) and u = Σ e^(s_j − m) v_j; a new key rescales both by
// e^(m_old − m_new); at the end o = u / ℓ and lse = m + ln ℓ (saved for the backward pass).
// One invocation per query row, ROWS rows of one (batch, head) per workgroup; K and V tiles in workgroup memory.
// Key tiles no row of the block can see (above the causal diagonal, before the window, past the key length) are
// never loaded. A row that sees no key gives o = 0.
// Head rows are vec4s and the products over a row are unrolled at build time (the score and accumulate placeholders):
// llvmpipe stops any invocation after 65,535 loop iterations, so a kernel that must run on it loops per key, not per
// element.
// Bindings are all read_write: cubecl sub-allocates tensors from shared buffers, which may alias.

@group(0) @binding(0) var<storage, read_write> q: array<f32>;     // [B, Hq, Tq, D]
@group(0) @binding(1) var<storage, read_write> k: array<f32>;     // [B, Hkv, Tk, D]
@group(0) @binding(2) var<storage, read_write> v: array<f32>;     // [B, Hkv, Tk, D]
@group(0) @binding(3) var<storage, read_write> o: array<f32>;     // [B, Hq, Tq, D]
@group(0) @binding(4) var<storage, read_write> lse: array<f32>;   // [B, Hq, Tq]
@group(0) @binding(5) var<storage, read_write> info: array<u32>;

{{ common }}

const ROWS: u32 = {{ rows }}u;
const TILE: u32 = {{ tile }}u;
const V: u32 = {{ vec4s }}u;              // D / 4

var<workgroup> k_tile: array<vec4<f32>, {{ tile_vec4s }}>;
var<workgroup> v_tile: array<vec4<f32>, {{ tile_vec4s }}>;
var<workgroup> block_keys: vec2<u32>;

@compute @workgroup_size({{ rows }}, 1, 1)
fn main(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let c = call();
    let b = wg.y / c.hq;
    let g = (wg.y % c.hq) / (c.hq / c.hkv);
    let r0 = wg.x * ROWS;
    let i = min(r0 + lid, c.tq - 1u);
    let d = c.d;
    let row_range = row_keys(c, b, i);
    // Keys any row of the block sees: from its first row's lo to its last row's hi; other tiles are never loaded.
    if (lid == 0u) {
        block_keys = vec2<u32>(row_range.x, row_keys(c, b, min(r0 + ROWS, c.tq) - 1u).y);
    }
    let keys = workgroupUniformLoad(&block_keys);
    let lo = row_range.x;
    let hi = row_range.y;

    let q_base = (wg.y * c.tq + i) * d;
    let kv_base = (b * c.hkv + g) * c.tk * d;
    var qr: array<vec4<f32>, V>;
    var u: array<vec4<f32>, V>;
    for (var x = 0u; x < V; x++) {
        let e = q_base + 4u * x;
        qr[x] = vec4<f32>(q[e], q[e + 1u], q[e + 2u], q[e + 3u]) * c.scale;
        u[x] = vec4<f32>(0.0);
    }
    var m = -3.0e38;
    var l = 0.0;

    for (var t0 = keys.x; t0 < keys.y; t0 += TILE) {
        let n = min(TILE, keys.y - t0);
        for (var idx = lid; idx < n * V; idx += ROWS) {
            let e = kv_base + t0 * d + 4u * idx;
            k_tile[idx] = vec4<f32>(k[e], k[e + 1u], k[e + 2u], k[e + 3u]);
            v_tile[idx] = vec4<f32>(v[e], v[e + 1u], v[e + 2u], v[e + 3u]);
        }
        workgroupBarrier();
        let t_lo = max(lo, t0) - t0;
        let t_hi = min(max(hi, t0), t0 + n) - t0;
        for (var t = t_lo; t < t_hi; t++) {
            let row = t * V;
            let s = {{ score }};
            let m_new = max(m, s);
            let correction = exp(m - m_new);
            let p = exp(s - m_new);
            l = l * correction + p;
            {{ accumulate }}
            m = m_new;
        }
        workgroupBarrier();
    }

    if (r0 + lid < c.tq) {
        let seen = l > 0.0;
        for (var x = 0u; x < V; x++) {
            let o_x = select(vec4<f32>(0.0), u[x] / l, seen);
            for (var e = 0u; e < 4u; e++) { o[q_base + 4u * x + e] = o_x[e]; }
        }
        lse[wg.y * c.tq + i] = select(0.0, m + log(l), seen);
    }
}
