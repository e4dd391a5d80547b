// C = A B on cooperative matrices (wgpu's EXPERIMENTAL_COOPERATIVE_MATRIX; Vulkan's VK_KHR_cooperative_matrix,
// tensor cores on NVIDIA): A [M, K] and B [K, N] row-major in f32 or f16, rounded to f16 in the tiles, every product
// accumulated in f32, C [M, N] f32. A workgroup is one subgroup and computes a 2N × 2N block of C from four N×N
// accumulators (N the side the adapter offers: 16 on GPUs, 8 on Mesa's lavapipe); per step of N along K it stages
// A's [2N, N] and B's [N, 2N] slices in workgroup memory (zero past the matrices' edges, so M, N and K need not be
// multiples of anything) and adds the four products C_ij += A_i B_j.
// Bindings are all read_write: cubecl sub-allocates tensors from shared buffers, which may alias.

enable wgpu_cooperative_matrix;
{{ types }}

@group(0) @binding(0) var<storage, read_write> a: array<Elem>;   // [M, K]
@group(0) @binding(1) var<storage, read_write> b: array<Elem>;   // [K, N]
@group(0) @binding(2) var<storage, read_write> c: array<f32>;    // [M, N]
@group(0) @binding(3) var<storage, read_write> info: array<u32>; // M, K, N, each at least 1

const THREADS: u32 = {{ threads }}u;   // the subgroup's size
const S: u32 = {{ n }}u;               // the matrices' side
const BLOCK: u32 = {{ block }}u;       // 2S: C's block is BLOCK × BLOCK

var<workgroup> a_tile: array<f16, {{ slice }}>;   // [BLOCK rows, S]
var<workgroup> b_tile: array<f16, {{ slice }}>;   // [S, BLOCK columns]
var<workgroup> c_tile: array<f32, {{ square }}>;  // [BLOCK, BLOCK]

@compute @workgroup_size({{ threads }}, 1, 1)
fn main(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let m = info[0];
    let k = info[1];
    let n = info[2];
    let row0 = wg.y * BLOCK;
    let col0 = wg.x * BLOCK;
    var c00 = {{ mat }}<f32, C>();
    var c01 = {{ mat }}<f32, C>();
    var c10 = {{ mat }}<f32, C>();
    var c11 = {{ mat }}<f32, C>();
    for (var k0 = 0u; k0 < k; k0 += S) {
        for (var idx = lid; idx < BLOCK * S; idx += THREADS) {
            // A's element (row0 + idx / S, k0 + idx % S); B's (k0 + idx / BLOCK, col0 + idx % BLOCK).
            let ar = row0 + idx / S;
            let ac = k0 + idx % S;
            a_tile[idx] = select(f16(0.0), f16(a[min(ar * k + ac, m * k - 1u)]), ar < m && ac < k);
            let br = k0 + idx / BLOCK;
            let bc = col0 + idx % BLOCK;
            b_tile[idx] = select(f16(0.0), f16(b[min(br * n + bc, k * n - 1u)]), br < k && bc < n);
        }
        workgroupBarrier();
        let a0 = coopLoadT<{{ mat }}<f16, A>>(&a_tile[0], S);
        let a1 = coopLoadT<{{ mat }}<f16, A>>(&a_tile[S * S], S);
        let b0 = coopLoadT<{{ mat }}<f16, B>>(&b_tile[0], BLOCK);
        let b1 = coopLoadT<{{ mat }}<f16, B>>(&b_tile[S], BLOCK);
        c00 = coopMultiplyAdd(a0, b0, c00);
        c01 = coopMultiplyAdd(a0, b1, c01);
        c10 = coopMultiplyAdd(a1, b0, c10);
        c11 = coopMultiplyAdd(a1, b1, c11);
        workgroupBarrier();
    }
    coopStoreT(c00, &c_tile[0], BLOCK);
    coopStoreT(c01, &c_tile[S], BLOCK);
    coopStoreT(c10, &c_tile[S * BLOCK], BLOCK);
    coopStoreT(c11, &c_tile[S * BLOCK + S], BLOCK);
    workgroupBarrier();
    for (var idx = lid; idx < BLOCK * BLOCK; idx += THREADS) {
        let r = row0 + idx / BLOCK;
        let col = col0 + idx % BLOCK;
        if (r < m && col < n) {
            c[r * n + col] = c_tile[idx];
        }
    }
}
