// FlashAttention-2 backward, keys and values: for key j, over the query rows of its GQA group that see it (packed
// head-minor as in the forward, n = t·g + r), p_nj = exp(s_nj − lse_n), dv_j = Σ_n p_nj dO_n,
// ds_nj = p_nj (dO_n · v_j − D_n), dk_j = scale · Σ_n ds_nj q_n. The group's heads are summed here, so K and V are
// never repeated.
// Folded (where the adapter has f32 atomics, `chunk_end` filled): dq_n += scale · Σ_j ds_nj k_j too, so the dq pass is
// skipped. Each chunk's ds of the block's key rows goes to workgroup memory, and the workgroup sums it against the
// block's k rows and adds the chunk's rows of dq with one atomicAdd per element (dq zeroed before the launch).
// A group of LANES lanes owns ROWS key rows, lane λ the vec4s x·LANES + λ of k, v, dk and dv; Q, dO, lse and D of a
// tile of packed query rows in workgroup memory; chunks of CHUNK query rows scored at once, every group walking every
// chunk of the tile (barriers in uniform control flow) and scoring those its rows see. The first key blocks see the
// most queries and run first. Runtime loops step over tiles and chunks only (the sum over the block is unrolled):
// llvmpipe stops an invocation after 65,535 loop iterations in all.
// Q rows are tiled as `Shared` and dO rows as `Elem`; with f16 tiles the k and v rows are rounded to f16 as the
// forward's tiles were, so that dO · v and D = rowsum(dO ⊙ o) agree where ds cancels.

{{ types }}

@group(0) @binding(0) var<storage, read_write> q: array<vec4<Elem>>;     // [B, Hq, Tq, D]
@group(0) @binding(1) var<storage, read_write> k: array<vec4<Elem>>;     // [B, Hkv, Tk, D]
@group(0) @binding(2) var<storage, read_write> v: array<vec4<Elem>>;     // [B, Hkv, Tk, D]
@group(0) @binding(3) var<storage, read_write> d_o: array<vec4<Elem>>;   // [B, Hq, Tq, D]
@group(0) @binding(4) var<storage, read_write> lse: array<f32>;         // [B, Hq, Tq]
@group(0) @binding(5) var<storage, read_write> delta: array<f32>;       // [B, Hq, Tq]
@group(0) @binding(6) var<storage, read_write> dk: array<vec4<Elem>>;    // [B, Hkv, Tk, D]
@group(0) @binding(7) var<storage, read_write> dv: array<vec4<Elem>>;    // [B, Hkv, Tk, D]
{{ outputs }}

{{ common }}

// LANES, ROWS, THREADS, BLOCK, TILE, CHUNK, V: the tier's layout (tiers.rs `Geometry`).
{{ geometry }}

var<workgroup> q_tile: array<vec4<Shared>, {{ tile_vec4s }}>;
var<workgroup> do_tile: array<vec4<Elem>, {{ tile_vec4s }}>;
var<workgroup> lse_tile: array<vec4<f32>, {{ tile_quads }}>;
var<workgroup> delta_tile: array<vec4<f32>, {{ tile_quads }}>;
var<workgroup> block_queries: vec2<u32>;
{{ exchange_memory }}
{{ fold_memory }}

@compute @workgroup_size({{ threads }}, 1, 1)
fn main(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let c = call();
    let b = wg.y / c.hkv;
    let kvh = wg.y % c.hkv;
    let g = c.hq / c.hkv;
    let rows = c.tk;
    let n0 = wg.x * BLOCK;
    let lane = lid % LANES;
    let first = n0 + lid / LANES * ROWS;
    // Packed query rows any key of the block is seen by: from its first key's lo to its last unpadded key's hi.
    if (lid == 0u) {
        let last = min(n0 + BLOCK, min(info[13u + b], c.tk));
        let lo = key_queries(c, b, n0).x;
        block_queries = g * vec2<u32>(lo, select(lo, key_queries(c, b, last - 1u).y, last > n0));
    }
    let queries = workgroupUniformLoad(&block_queries);
    let kv = (b * c.hkv + kvh) * c.tk;

    {{ row_setup }}

    for (var t0 = queries.x; t0 < queries.y; t0 += TILE) {
        let n = min(TILE, queries.y - t0);
        for (var idx = lid; idx < TILE * V; idx += THREADS) {
            let i = idx / V;
            let e = packed_row(c, b, kvh, t0 + min(i, n - 1u)).x * V + idx % V;
            q_tile[idx] = select(vec4<Shared>(0.0), vec4<Shared>(q[e]), i < n);
            do_tile[idx] = select(vec4<Elem>(0.0), d_o[e], i < n);
        }
        for (var i = lid; i < TILE; i += THREADS) {
            let row = packed_row(c, b, kvh, t0 + min(i, n - 1u)).x;
            lse_tile[i / 4u][i % 4u] = select(0.0, lse[row], i < n);
            delta_tile[i / 4u][i % 4u] = select(0.0, delta[row], i < n);
        }
        workgroupBarrier();
        // The group's chunks of the tile: [c_lo, c_hi).
        let c_lo = (max(lo, t0) - t0) / CHUNK * CHUNK;
        let c_hi = min(max(hi, t0), t0 + n) - t0;
        for (var j0 = 0u; j0 < n; j0 += CHUNK) {
            let jv = vec4<u32>(t0 + j0) + vec4<u32>(0u, 1u, 2u, 3u);
            if (j0 >= c_lo && j0 < c_hi) {
                {{ chunk_code }}
            } {{ chunk_skip }}
            // Folded: dq_n += scale · Σ_j ds_nj k_j over the block's key rows j, for the chunk's rows n (atomicAdd).
            {{ chunk_end }}
        }
        workgroupBarrier();
    }

    {{ row_finish }}
}
