// Flash-decoding, merge step: the splits' partial states of one query row combine as
// M = max_s m_s, ℓ = Σ_s ℓ_s e^(m_s − M), o = Σ_s u_s e^(m_s − M) / ℓ, lse = M + ln ℓ; no key seen gives o = 0.
// A workgroup per query row (row = x + y · min(rows, 65,535), so any number of rows fits the grid), an invocation per
// vec4 of o.
// Bindings are all read_write: cubecl sub-allocates tensors from shared buffers, which may alias.

{{ types }}

@group(0) @binding(0) var<storage, read_write> part_m: array<f32>;          // [rows, splits]
@group(0) @binding(1) var<storage, read_write> part_l: array<f32>;          // [rows, splits]
@group(0) @binding(2) var<storage, read_write> part_u: array<vec4<f32>>;    // [rows, splits, D]
@group(0) @binding(3) var<storage, read_write> o: array<vec4<Elem>>;         // [rows, D]
@group(0) @binding(4) var<storage, read_write> lse: array<f32>;             // [rows]
@group(0) @binding(5) var<storage, read_write> info: array<u32>;

{{ common }}

const WG: u32 = {{ workgroup }}u;

@compute @workgroup_size({{ workgroup }}, 1, 1)
fn main(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let rows = info[0] * info[1] * info[3];
    let row = wg.x + wg.y * min(rows, 65535u);
    if (row >= rows) { return; }
    let v4 = info[5] / 4u;
    let splits = info[11];
    let first = row * splits;
    // M, then ℓ.
    var big_m = MASKED;
    for (var s = 0u; s < splits; s++) { big_m = max(big_m, part_m[first + s]); }
    var l = 0.0;
    for (var s = 0u; s < splits; s++) { l += part_l[first + s] * exp(part_m[first + s] - big_m); }
    // o's vec4 e: the splits' u weighted by e^(m_s − M), over ℓ.
    for (var e = lid; e < v4; e += WG) {
        var acc = vec4<f32>(0.0);
        for (var s = 0u; s < splits; s++) { acc += part_u[(first + s) * v4 + e] * exp(part_m[first + s] - big_m); }
        o[row * v4 + e] = vec4<Elem>(normalized(acc, l));
    }
    if (lid == 0u) { lse[row] = log_sum_exp(big_m, l); }
}
