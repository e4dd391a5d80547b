// Flash-decoding, split step: a few query rows against a long cache. A workgroup takes one split of the keys (SPLIT
// keys, info[10]; info[11] splits) for a block of up to R query rows of one (batch row, KV head): its GQA group's g
// query heads × Tq positions, packed head-minor (row n = t·g + r), so they share one K/V stream and each key is read
// once for all of them. It keeps each row's partial online-softmax state (m, ℓ = Σ e^(s_j − m), u = Σ e^(s_j − m) v_j)
// over the keys of the split the row sees, and flash_decode_reduce.wgsl merges the splits.
// Per tile of TILE keys: (1) the invocations load the tile's K and V rows into workgroup memory, consecutive
// invocations taking consecutive vec4s of a row (coalesced); (2) each (row, key) pair's score q·k is split over QD
// invocations, each summing the vec4s x ≡ slice mod QD of q (held scaled in workgroup memory) against k; (3) one
// invocation per pair sums the slices and masks keys outside the row's range; (4) one invocation per row takes the
// tile's maximum, rescales ℓ once, turns the scores into p = e^(s − m) in place and adds them to ℓ; (5) invocation
// (x, part) rescales its vec4 x of every row's u once and adds p·v over the tile's keys j ≡ part mod P, reading each
// v vec4 once for all rows. At the end the P parts of u are summed in workgroup memory and written out.
// Rows in workgroup memory are S = V rounded up to odd vec4s long, so vec4 reads across rows fall on distinct banks.
// Keys and values come from the source pasted in below (kv_source): contiguous or paged f32 or f16
// (flash_kv_float.wgsl), or int8 codes with per-group scales, dequantized as they are read (flash_kv_int8.wgsl).
// The K and V tiles hold `Shared` (f32, or f16 in the half tier); scores, p and u are f32.
// Every runtime loop runs over tiles, vec4s of a row or rows (llvmpipe stops an invocation after 65,535 loop
// iterations in all); no subgroup operations, at most 16 KiB of workgroup memory (WebGPU's portable limit).
// Bindings are all read_write: cubecl sub-allocates tensors from shared buffers, which may alias.

{{ types }}

@group(0) @binding(0) var<storage, read_write> q: array<vec4<Elem>>;        // [B, Hq, Tq, D]
@group(0) @binding(1) var<storage, read_write> part_m: array<f32>;         // [B·Hq·Tq, splits]
@group(0) @binding(2) var<storage, read_write> part_l: array<f32>;         // [B·Hq·Tq, splits]
@group(0) @binding(3) var<storage, read_write> part_u: array<vec4<f32>>;   // [B·Hq·Tq, splits, D]
@group(0) @binding(4) var<storage, read_write> info: array<u32>;

{{ common }}

// Where keys and values are read from: bindings 5…, key_row(b, g, j), key_vec4(row, x), value_vec4(row, x).
{{ kv_source }}

const WG: u32 = {{ workgroup }}u;
const R: u32 = {{ rows }}u;               // query rows per workgroup
const TILE: u32 = {{ tile }}u;            // keys per tile
const V: u32 = {{ vec4s }}u;              // D / 4
const S: u32 = {{ stride }}u;             // vec4s per row in workgroup memory: V rounded up to odd
const QD: u32 = {{ dot_parts }}u;         // invocations per score, R · TILE · QD ≤ max(WG, R · TILE)
const P: u32 = {{ key_parts }}u;          // invocations per vec4 of u, P · V ≤ WG

var<workgroup> q_tile: array<vec4<f32>, {{ row_vec4s }}>;     // R × S: the block's q rows, scaled; at the end u
var<workgroup> k_tile: array<vec4<Shared>, {{ tile_vec4s }}>; // TILE × S
var<workgroup> v_tile: array<vec4<Shared>, {{ tile_vec4s }}>; // TILE × S
var<workgroup> slices: array<f32, {{ slice_count }}>;         // R × TILE × QD partial scores
var<workgroup> scores: array<f32, {{ score_count }}>;         // R × TILE: scores, then p
var<workgroup> ranges: array<vec2<u32>, {{ rows }}>;          // the keys each row sees
var<workgroup> rescale: array<f32, {{ rows }}>;               // each row's e^(m_old − m_new) for the tile
var<workgroup> split_keys: vec2<u32>;

@compute @workgroup_size({{ workgroup }}, 1, 1)
fn main(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let c = call();
    let split = info[10];
    let splits = info[11];
    let rows = packed_rows(c);
    let blocks = (rows + R - 1u) / R;
    let bh = wg.y / blocks;                             // b · Hkv + kvh
    let b = bh / c.hkv;
    let kvh = bh % c.hkv;
    let n0 = wg.y % blocks * R;                         // the block's first packed row
    let count = min(R, rows - n0);                      // its real rows

    // The block's q rows, scaled; padding (vec4s past V, rows past count) zero.
    for (var i = lid; i < R * S; i += WG) {
        let r = i / S;
        let x = i % S;
        var value = vec4<f32>(0.0);
        if (r < count && x < V) { value = vec4<f32>(q[packed_row(c, b, kvh, n0 + r).x * V + x]) * c.scale; }
        q_tile[i] = value;
    }
    // Each row's key range (rows past count see none).
    if (lid < R) {
        var range = vec2<u32>(0u, 0u);
        if (lid < count) { range = row_keys(c, b, packed_row(c, b, kvh, n0 + lid).y); }
        ranges[lid] = range;
    }
    // The split's keys that some row of the block sees: both ends of a row's range grow with its position.
    if (lid == 0u) {
        let seen = keys_seen(c, b, kvh, n0, n0 + count - 1u);
        let s0 = max(seen.x, wg.x * split);
        split_keys = vec2<u32>(s0, max(s0, min(seen.y, (wg.x + 1u) * split)));
    }
    let keys = workgroupUniformLoad(&split_keys);

    // Row owner (lid < R): its row's m and ℓ. Invocation (x, part): vec4 x of every row's u over its keys.
    var m = MASKED;
    var l = 0.0;
    let x = lid % V;
    let part = lid / V;
    var u: array<vec4<f32>, R>;
    for (var r = 0u; r < R; r++) { u[r] = vec4<f32>(0.0); }

    for (var t0 = keys.x; t0 < keys.y; t0 += TILE) {
        let n = min(TILE, keys.y - t0);
        // (1) K and V rows of the tile, coalesced; keys past n zero.
        for (var i = lid; i < TILE * V; i += WG) {
            let j = i / V;
            let e = i % V;
            var kx = vec4<f32>(0.0);
            var vx = vec4<f32>(0.0);
            if (j < n) {
                let row = key_row(b, kvh, t0 + j);
                kx = key_vec4(row, e);
                vx = value_vec4(row, e);
            }
            k_tile[j * S + e] = vec4<Shared>(kx);
            v_tile[j * S + e] = vec4<Shared>(vx);
        }
        workgroupBarrier();
        // (2) Slice `i mod QD` of the score of pair (r, j) = ⌊i / QD⌋: q_r · k_j over vec4s slice, slice + QD, ….
        for (var i = lid; i < R * TILE * QD; i += WG) {
            let slice = i % QD;
            let pair = i / QD;
            let qr = pair / TILE * S;
            let kj = pair % TILE * S;
            var s = 0.0;
            for (var y = slice; y < V; y += QD) { s += dot(q_tile[qr + y], vec4<f32>(k_tile[kj + y])); }
            slices[i] = s;
        }
        workgroupBarrier();
        // (3) Pair (r, j)'s score: its slices summed, MASKED where row r does not see key t0 + j.
        for (var i = lid; i < R * TILE; i += WG) {
            let range = ranges[i / TILE];
            let key = t0 + i % TILE;
            var s = 0.0;
            for (var y = 0u; y < QD; y++) { s += slices[i * QD + y]; }
            scores[i] = select(MASKED, s, i % TILE < n && key >= range.x && key < range.y);
        }
        workgroupBarrier();
        // (4) Row owner: m_new = max(m, the tile's scores); ℓ = ℓ·e^(m − m_new) + Σ p, p = e^(s − m_new) (0 if masked).
        if (lid < R) {
            let at = lid * TILE;
            var m_new = m;
            for (var j = 0u; j < n; j++) { m_new = max(m_new, scores[at + j]); }
            let correction = exp(m - m_new);
            var sum = 0.0;
            for (var j = 0u; j < n; j++) {
                let s = scores[at + j];
                let p = select(0.0, exp(s - m_new), s > MASKED);
                scores[at + j] = p;
                sum += p;
            }
            l = l * correction + sum;
            m = m_new;
            rescale[lid] = correction;
        }
        workgroupBarrier();
        // (5) u_r ← u_r · e^(m_old − m_new) + Σ_j p_rj v_j over keys j ≡ part mod P, v_j's vec4 x read once for all rows.
        if (part < P) {
            for (var r = 0u; r < R; r++) { u[r] *= rescale[r]; }
            for (var j = part; j < n; j += P) {
                let w = vec4<f32>(v_tile[j * S + x]);
                for (var r = 0u; r < R; r++) { u[r] += scores[r * TILE + j] * w; }
            }
        }
        workgroupBarrier();
    }

    // u summed over the P parts into q_tile (q no longer needed), one part after another.
    for (var p = 0u; p < P; p++) {
        workgroupBarrier();
        if (part == p) {
            for (var r = 0u; r < R; r++) {
                let at = r * S + x;
                q_tile[at] = select(q_tile[at] + u[r], u[r], p == 0u);
            }
        }
    }
    workgroupBarrier();
    // The block's partial states at (row, split).
    for (var i = lid; i < count * V; i += WG) {
        let r = i / V;
        let row = packed_row(c, b, kvh, n0 + r).x;
        part_u[(row * splits + wg.x) * V + i % V] = q_tile[r * S + i % V];
    }
    if (lid < count) {
        let at = packed_row(c, b, kvh, n0 + lid).x * splits + wg.x;
        part_m[at] = m;
        part_l[at] = l;
    }
}
