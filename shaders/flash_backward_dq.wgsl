// FlashAttention-2 backward, queries: recompute p_ij = exp(s_ij − lse_i) tile by tile, dp_ij = dO_i · v_j,
// ds_ij = p_ij (dp_ij − D_i) with D_i = rowsum(dO_i ⊙ o_i), and dq_i = scale · Σ_j ds_ij k_j. No T×T buffer.
// Same tiling and key ranges as flash_forward.wgsl: one invocation per query row, K and V tiles in workgroup memory.

@group(0) @binding(0) var<storage, read_write> q: array<f32>;     // [B, Hq, Tq, D]
@group(0) @binding(1) var<storage, read_write> k: array<f32>;     // [B, Hkv, Tk, D]
@group(0) @binding(2) var<storage, read_write> v: array<f32>;     // [B, Hkv, Tk, D]
@group(0) @binding(3) var<storage, read_write> d_o: array<f32>;   // [B, Hq, Tq, D]
@group(0) @binding(4) var<storage, read_write> lse: array<f32>;   // [B, Hq, Tq]
@group(0) @binding(5) var<storage, read_write> delta: array<f32>; // [B, Hq, Tq]: D_i
@group(0) @binding(6) var<storage, read_write> dq: array<f32>;    // [B, Hq, Tq, D]
@group(0) @binding(7) var<storage, read_write> info: array<u32>;

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
    if (lid == 0u) {
        block_keys = vec2<u32>(row_range.x, row_keys(c, b, min(r0 + ROWS, c.tq) - 1u).y);
    }
    let keys = workgroupUniformLoad(&block_keys);
    let lo = row_range.x;
    let hi = row_range.y;

    let row = wg.y * c.tq + i;
    let q_base = row * d;
    let kv_base = (b * c.hkv + g) * c.tk * d;
    var qr: array<vec4<f32>, V>;
    var dor: array<vec4<f32>, V>;
    var acc: array<vec4<f32>, V>;
    for (var x = 0u; x < V; x++) {
        let e = q_base + 4u * x;
        qr[x] = vec4<f32>(q[e], q[e + 1u], q[e + 2u], q[e + 3u]) * c.scale;
        dor[x] = vec4<f32>(d_o[e], d_o[e + 1u], d_o[e + 2u], d_o[e + 3u]);
        acc[x] = vec4<f32>(0.0);
    }
    let lse_i = lse[row];
    let delta_i = delta[row];

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
            let dp = {{ dp }};
            let ds = exp(s - lse_i) * (dp - delta_i);
            {{ accumulate }}
        }
        workgroupBarrier();
    }

    if (r0 + lid < c.tq) {
        for (var x = 0u; x < V; x++) {
            for (var e = 0u; e < 4u; e++) { dq[q_base + 4u * x + e] = acc[x][e] * c.scale; }
        }
    }
}
