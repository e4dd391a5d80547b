// Flash-decoding, split step: a few query rows against a long cache. The keys a row sees, [lo, hi), are cut into
// splits of SPLIT keys, one workgroup each; the workgroup keeps that split's partial online-softmax state
// (m, ℓ = Σ e^(s_j − m), u = Σ e^(s_j − m) v_j) and flash_decode_reduce.wgsl merges the splits.
// Within a workgroup, invocation t scores key t of each tile of WG keys; then every invocation updates the
// value dimensions t, t + WG, … of u, so loads of K rows and of V columns are both spread over the workgroup.
// Keys and values come from the source pasted in below (kv_source): contiguous or paged f32 (flash_kv_f32.wgsl), or
// int8 codes with per-group scales, dequantized as they are read (flash_kv_int8.wgsl).

@group(0) @binding(0) var<storage, read_write> q: array<f32>;         // [B, Hq, Tq, D]
@group(0) @binding(1) var<storage, read_write> part_m: array<f32>;    // [B·Hq·Tq, splits]
@group(0) @binding(2) var<storage, read_write> part_l: array<f32>;    // [B·Hq·Tq, splits]
@group(0) @binding(3) var<storage, read_write> part_u: array<f32>;    // [B·Hq·Tq, splits, D]
@group(0) @binding(4) var<storage, read_write> info: array<u32>;

{{ common }}

// Where keys and values are read from: bindings 5…, key_row(b, g, j), key_at(row, e), value_at(row, e).
{{ kv_source }}

const WG: u32 = {{ workgroup }}u;
const DMAX: u32 = {{ dmax }}u;
const SLOTS: u32 = {{ slots }}u;

var<workgroup> q_row: array<f32, DMAX>;
var<workgroup> scores: array<f32, {{ workgroup }}>;
var<workgroup> split_keys: vec2<u32>;

@compute @workgroup_size({{ workgroup }}, 1, 1)
fn main(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let c = call();
    let split = info[10];
    let splits = info[11];
    let d = c.d;
    let row = wg.y;                       // (b · Hq + h) · Tq + i
    let i = row % c.tq;
    let b = row / c.tq / c.hq;
    let g = (row / c.tq) % c.hq / (c.hq / c.hkv);
    let range = row_keys(c, b, i);
    for (var e = lid; e < d; e += WG) { q_row[e] = q[row * d + e] * c.scale; }
    if (lid == 0u) {
        let s0 = max(range.x, wg.x * split);
        split_keys = vec2<u32>(s0, max(s0, min(range.y, (wg.x + 1u) * split)));
    }
    let keys = workgroupUniformLoad(&split_keys);

    var m = -3.0e38;
    var l = 0.0;
    var u: array<f32, SLOTS>;
    for (var slot = 0u; slot < SLOTS; slot++) { u[slot] = 0.0; }
    for (var t0 = keys.x; t0 < keys.y; t0 += WG) {
        let n = min(WG, keys.y - t0);
        var s = -3.0e38;
        if (lid < n) {
            let base = key_row(b, g, t0 + lid);
            s = 0.0;
            for (var e = 0u; e < d; e++) { s += q_row[e] * key_at(base, e); }
        }
        scores[lid] = s;
        workgroupBarrier();
        var m_tile = -3.0e38;
        for (var t = 0u; t < n; t++) { m_tile = max(m_tile, scores[t]); }
        let m_new = max(m, m_tile);
        let correction = exp(m - m_new);
        l *= correction;
        for (var slot = 0u; slot < SLOTS; slot++) { u[slot] *= correction; }
        for (var t = 0u; t < n; t++) {
            let p = exp(scores[t] - m_new);
            l += p;
            let base = key_row(b, g, t0 + t);
            for (var slot = 0u; slot < SLOTS; slot++) {
                let e = lid + slot * WG;
                if (e < d) { u[slot] += p * value_at(base, e); }
            }
        }
        m = m_new;
        workgroupBarrier();
    }

    let part = row * splits + wg.x;
    if (lid == 0u) {
        part_m[part] = m;
        part_l[part] = l;
    }
    for (var slot = 0u; slot < SLOTS; slot++) {
        let e = lid + slot * WG;
        if (e < d) { part_u[part * d + e] = u[slot]; }
    }
}
