// Exclusive prefix sum along the chunk axis, for causal linear attention's chunk states:
// y[o, c, i] = Σ_{c' < c} x[o, c', i], or with `reverse` Σ_{c' > c} x[o, c', i] (the forward's gradient).
// An invocation per (o, i) walks the chunks in order, so the sum is sequential and exact to f32 rounding, with no
// subtraction of a running total; invocation = global x + global y · (workgroups in x · 64), so any size fits.
// Bindings are all read_write: cubecl sub-allocates tensors from shared buffers, which may alias.

@group(0) @binding(0) var<storage, read_write> x: array<f32>;      // [outer, chunks, inner]
@group(0) @binding(1) var<storage, read_write> y: array<f32>;      // [outer, chunks, inner]
@group(0) @binding(2) var<storage, read_write> info: array<u32>;   // outer, chunks, inner, reverse

@compute @workgroup_size(64, 1, 1)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let outer = info[0];
    let chunks = info[1];
    let inner = info[2];
    let reverse = info[3] != 0u;
    let id = gid.x + gid.y * groups.x * 64u;
    if (id >= outer * inner) { return; }
    let o = id / inner;
    let i = id % inner;
    var sum = 0.0;
    for (var n = 0u; n < chunks; n++) {
        let c = select(n, chunks - 1u - n, reverse);
        let at = (o * chunks + c) * inner + i;
        let value = x[at];
        y[at] = sum;
        sum += value;
    }
}
