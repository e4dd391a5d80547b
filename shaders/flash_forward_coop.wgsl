// FlashAttention forward on cooperative matrices (wgpu's EXPERIMENTAL_COOPERATIVE_MATRIX; Vulkan's
// VK_KHR_cooperative_matrix, tensor cores on NVIDIA): o = softmax(q kᵀ·scale + mask) v, exact, N keys at a time,
// N×N matrices with N the side the adapter offers (16 on GPUs, 8 on Mesa's lavapipe).
// A workgroup is one subgroup and takes N packed query rows of one (batch, KV head), its GQA group's heads packed
// head-minor as in flash_queries.wgsl. Per tile of N keys:
//   S = Q Kᵀ        D/N multiply-adds of N×N f16 tiles into an f32 accumulator, stored to workgroup memory;
//   online softmax  one invocation per row: m_new = max(m, max_j s_j), α = e^(m − m_new), p_j = e^(s_j − m_new)
//                   (0 where the mask hides key j), ℓ = α ℓ + Σ_j p_j, with p rounded to f16 as P V will use it;
//   U = diag(α) U + P V   U [N, D] in f32 in workgroup memory, rescaled, then D/N more multiply-adds.
// At the end o = U / ℓ and lse = m + ln ℓ; a row that sees no key gives o = 0 and lse = 0. q, k and v are rounded
// to f16 in the tiles (as the backward's f16 tiles round them); every sum is f32.
// Bindings are all read_write: cubecl sub-allocates tensors from shared buffers, which may alias.

enable wgpu_cooperative_matrix;
{{ types }}

@group(0) @binding(0) var<storage, read_write> q: array<Elem>;   // [B, Hq, Tq, D]
@group(0) @binding(1) var<storage, read_write> k: array<Elem>;   // [B, Hkv, Tk, D]
@group(0) @binding(2) var<storage, read_write> v: array<Elem>;   // [B, Hkv, Tk, D]
@group(0) @binding(3) var<storage, read_write> o: array<Elem>;   // [B, Hq, Tq, D]
@group(0) @binding(4) var<storage, read_write> lse: array<f32>;  // [B, Hq, Tq]
@group(0) @binding(5) var<storage, read_write> info: array<u32>;

{{ common }}

const THREADS: u32 = {{ threads }}u;   // the subgroup's size, at least N
const N: u32 = {{ n }}u;               // the matrices' side: rows and keys per tile
const D: u32 = {{ d }}u;               // a multiple of N
const TILE: u32 = {{ tile }}u;         // N · D

var<workgroup> q_tile: array<f16, TILE>;      // [N rows, D]
var<workgroup> k_tile: array<f16, TILE>;      // [N keys, D]
var<workgroup> v_tile: array<f16, TILE>;      // [N keys, D]
var<workgroup> u_tile: array<f32, TILE>;      // [N rows, D]
var<workgroup> s_tile: array<f32, {{ nn }}>;  // [N rows, N keys]
var<workgroup> p_tile: array<f16, {{ nn }}>;  // [N rows, N keys]
var<workgroup> row_scale: array<f32, N>;      // α per row, then ℓ
var<workgroup> block_keys: vec2<u32>;

@compute @workgroup_size({{ threads }}, 1, 1)
fn main(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let c = call();
    let b = wg.y / c.hkv;
    let kvh = wg.y % c.hkv;
    let rows = packed_rows(c);
    let n0 = wg.x * N;
    if (lid == 0u) {
        let last = min(n0 + N, rows) - 1u;
        block_keys = keys_seen(c, b, kvh, n0, last);
    }
    // Q's rows in f16 (rows past the last zero), U zero.
    for (var idx = lid; idx < TILE; idx += THREADS) {
        let n = n0 + idx / D;
        var x = f16(0.0);
        if (n < rows) {
            x = f16(q[packed_row(c, b, kvh, n).x * D + idx % D]);
        }
        q_tile[idx] = x;
        u_tile[idx] = 0.0;
    }
    // Invocation r < N keeps row r's softmax state and the keys it sees.
    var m = MASKED;
    var l = 0.0;
    var seen = vec2<u32>(0u, 0u);
    if (lid < N && n0 + lid < rows) {
        seen = row_keys(c, b, packed_row(c, b, kvh, n0 + lid).y);
    }
    let keys = workgroupUniformLoad(&block_keys);
    let kv = (b * c.hkv + kvh) * c.tk * D;

    for (var t0 = keys.x; t0 < keys.y; t0 += N) {
        let n = min(N, keys.y - t0);
        // The tile's tail is zeroed: its scores are masked, and 0 · 0 adds nothing to U.
        for (var idx = lid; idx < TILE; idx += THREADS) {
            let e = kv + t0 * D + min(idx, n * D - 1u);
            k_tile[idx] = select(f16(0.0), f16(k[e]), idx < n * D);
            v_tile[idx] = select(f16(0.0), f16(v[e]), idx < n * D);
        }
        workgroupBarrier();
        // S = Q Kᵀ: A = Q[:, d0:d0+N] row-major; B = Kᵀ[d0:d0+N, :], K's rows read column-major.
        var s = {{ mat }}<f32, C>();
        for (var d0 = 0u; d0 < D; d0 += N) {
            let qa = coopLoadT<{{ mat }}<f16, A>>(&q_tile[d0], D);
            let kb = coopLoad<{{ mat }}<f16, B>>(&k_tile[d0], D);
            s = coopMultiplyAdd(qa, kb, s);
        }
        coopStoreT(s, &s_tile[0], N);
        workgroupBarrier();
        if (lid < N) {
            var m_new = m;
            for (var j = 0u; j < N; j++) {
                let key = t0 + j;
                if (key >= seen.x && key < seen.y) {
                    m_new = max(m_new, s_tile[lid * N + j] * c.scale);
                }
            }
            let alpha = exp(m - m_new);
            var sum = 0.0;
            for (var j = 0u; j < N; j++) {
                let key = t0 + j;
                var p = f16(0.0);
                if (key >= seen.x && key < seen.y) {
                    p = f16(exp(s_tile[lid * N + j] * c.scale - m_new));
                }
                p_tile[lid * N + j] = p;
                sum += f32(p);
            }
            l = l * alpha + sum;
            m = m_new;
            row_scale[lid] = alpha;
        }
        workgroupBarrier();
        for (var idx = lid; idx < TILE; idx += THREADS) {
            u_tile[idx] *= row_scale[idx / D];
        }
        workgroupBarrier();
        // U += P V: A = P row-major; B = V[:, d0:d0+N] row-major.
        let pa = coopLoadT<{{ mat }}<f16, A>>(&p_tile[0], N);
        for (var d0 = 0u; d0 < D; d0 += N) {
            var u = coopLoadT<{{ mat }}<f32, C>>(&u_tile[d0], D);
            let vb = coopLoadT<{{ mat }}<f16, B>>(&v_tile[d0], D);
            u = coopMultiplyAdd(pa, vb, u);
            coopStoreT(u, &u_tile[d0], D);
        }
        workgroupBarrier();
    }

    if (lid < N) {
        row_scale[lid] = l;
        if (n0 + lid < rows) {
            lse[packed_row(c, b, kvh, n0 + lid).x] = log_sum_exp(m, l);
        }
    }
    workgroupBarrier();
    for (var idx = lid; idx < TILE; idx += THREADS) {
        let n = n0 + idx / D;
        let l_row = row_scale[idx / D];
        if (n < rows) {
            o[packed_row(c, b, kvh, n).x * D + idx % D] = Elem(select(0.0, u_tile[idx] / l_row, l_row > 0.0));
        }
    }
}
