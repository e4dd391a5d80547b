// FlashAttention-2 backward, keys and values: for key j, over the query heads r of its GQA group and the query rows i
// that see it, p_ij = exp(s_ij − lse_i), dv_j = Σ p_ij dO_i, ds_ij = p_ij (dO_i · v_j − D_i), dk_j = scale · Σ ds_ij q_i.
// One invocation per key row, ROWS keys of one (batch, KV head) per workgroup; Q and dO tiles in workgroup memory.
// The group's heads are summed here, so K and V are never repeated and no atomics are needed.

@group(0) @binding(0) var<storage, read_write> q: array<f32>;     // [B, Hq, Tq, D]
@group(0) @binding(1) var<storage, read_write> k: array<f32>;     // [B, Hkv, Tk, D]
@group(0) @binding(2) var<storage, read_write> v: array<f32>;     // [B, Hkv, Tk, D]
@group(0) @binding(3) var<storage, read_write> d_o: array<f32>;   // [B, Hq, Tq, D]
@group(0) @binding(4) var<storage, read_write> lse: array<f32>;   // [B, Hq, Tq]
@group(0) @binding(5) var<storage, read_write> delta: array<f32>; // [B, Hq, Tq]
@group(0) @binding(6) var<storage, read_write> dk: array<f32>;    // [B, Hkv, Tk, D]
@group(0) @binding(7) var<storage, read_write> dv: array<f32>;    // [B, Hkv, Tk, D]
@group(0) @binding(8) var<storage, read_write> info: array<u32>;

{{ common }}

const ROWS: u32 = {{ rows }}u;
const TILE: u32 = {{ tile }}u;
const V: u32 = {{ vec4s }}u;              // D / 4

var<workgroup> q_tile: array<vec4<f32>, {{ tile_vec4s }}>;
var<workgroup> do_tile: array<vec4<f32>, {{ tile_vec4s }}>;
var<workgroup> block_queries: vec2<u32>;

@compute @workgroup_size({{ rows }}, 1, 1)
fn main(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let c = call();
    let b = wg.y / c.hkv;
    let g = wg.y % c.hkv;
    let group = c.hq / c.hkv;
    let c0 = wg.x * ROWS;
    let j = min(c0 + lid, c.tk - 1u);
    let d = c.d;
    let key_range = key_queries(c, b, j);
    // Queries any key of the block is seen by: from its first key's lo to its last unpadded key's hi.
    if (lid == 0u) {
        let last = min(c0 + ROWS, min(info[13u + b], c.tk));
        block_queries = vec2<u32>(key_range.x, select(key_range.x, key_queries(c, b, last - 1u).y, last > c0));
    }
    let queries = workgroupUniformLoad(&block_queries);
    let lo = key_range.x;
    let hi = key_range.y;

    let kv_row = wg.y * c.tk + j;
    var kr: array<vec4<f32>, V>;
    var vr: array<vec4<f32>, V>;
    var dk_acc: array<vec4<f32>, V>;
    var dv_acc: array<vec4<f32>, V>;
    for (var x = 0u; x < V; x++) {
        let e = kv_row * d + 4u * x;
        kr[x] = vec4<f32>(k[e], k[e + 1u], k[e + 2u], k[e + 3u]) * c.scale;
        vr[x] = vec4<f32>(v[e], v[e + 1u], v[e + 2u], v[e + 3u]);
        dk_acc[x] = vec4<f32>(0.0);
        dv_acc[x] = vec4<f32>(0.0);
    }

    for (var r = g * group; r < (g + 1u) * group; r++) {
        let head_row = (b * c.hq + r) * c.tq;
        for (var t0 = queries.x; t0 < queries.y; t0 += TILE) {
            let n = min(TILE, queries.y - t0);
            for (var idx = lid; idx < n * V; idx += ROWS) {
                let e = (head_row + t0) * d + 4u * idx;
                q_tile[idx] = vec4<f32>(q[e], q[e + 1u], q[e + 2u], q[e + 3u]);
                do_tile[idx] = vec4<f32>(d_o[e], d_o[e + 1u], d_o[e + 2u], d_o[e + 3u]);
            }
            workgroupBarrier();
            let t_lo = max(lo, t0) - t0;
            let t_hi = min(max(hi, t0), t0 + n) - t0;
            for (var t = t_lo; t < t_hi; t++) {
                let row = t * V;
                let s = {{ score }};
                let dp = {{ dp }};
                let p = exp(s - lse[head_row + t0 + t]);
                let ds = p * (dp - delta[head_row + t0 + t]);
                {{ accumulate }}
            }
            workgroupBarrier();
        }
    }

    if (c0 + lid < c.tk) {
        for (var x = 0u; x < V; x++) {
            for (var e = 0u; e < 4u; e++) {
                dk[kv_row * d + 4u * x + e] = dk_acc[x][e] * c.scale;
                dv[kv_row * d + 4u * x + e] = dv_acc[x][e];
            }
        }
    }
}
