// y = x Wᵀ with W [m, k] kept in ggml's block formats (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K, F16, BF16,
// F32), each value dequantized in the shader as ggml defines it (crates/formats/src/ggml.rs): an invocation per
// output y[i, j] walks row j's blocks, reading each block's scales once. With `rows` (the
// embedding lookup) an invocation per id writes row ids[r] of W instead: y[r, e] = W[ids[r], e].
// W's bytes are little-endian u32 words (blocks are not word-aligned: Q4_0's are 18 bytes). Consecutive groups of
// rows may differ in format: info holds (ggml type, rows, bytes per row) for each part.
// Bindings are all read_write: cubecl sub-allocates tensors from shared buffers, which may alias.

@group(0) @binding(0) var<storage, read_write> x: array<f32>;     // [n, k] (rows: the ids, as f32 bit patterns of u32)
@group(0) @binding(1) var<storage, read_write> w: array<u32>;     // W's blocks, row after row
@group(0) @binding(2) var<storage, read_write> y: array<f32>;     // [n, m] (rows: [n, k])
@group(0) @binding(3) var<storage, read_write> info: array<u32>;  // n, k, m, parts, then (type, rows, row bytes)

const ROWS_MODE: bool = {{ rows }};

fn byte(at: u32) -> u32 {
    return (w[at >> 2u] >> ((at & 3u) * 8u)) & 0xffu;
}

fn word(at: u32) -> u32 {
    return byte(at) | (byte(at + 1u) << 8u) | (byte(at + 2u) << 16u) | (byte(at + 3u) << 24u);
}

fn half(at: u32) -> f32 {
    return unpack2x16float(byte(at) | (byte(at + 1u) << 8u)).x;
}

// The 4-bit value e of a 32-value block: e < 16 in the low nibble of byte e, 16 + e in its high nibble.
fn nibble(qs: u32, e: u32) -> u32 {
    if (e < 16u) {
        return byte(qs + e) & 15u;
    }
    return byte(qs + e - 16u) >> 4u;
}

// Sub-block j's 6-bit scale (.x) and min (.y) in the 12 scale bytes at `s` of a Q4_K / Q5_K super-block.
fn scale_min(j: u32, s: u32) -> vec2<f32> {
    if (j < 4u) {
        return vec2<f32>(f32(byte(s + j) & 63u), f32(byte(s + j + 4u) & 63u));
    }
    let sc = (byte(s + j + 4u) & 15u) | ((byte(s + j - 4u) >> 6u) << 4u);
    let mn = (byte(s + j + 4u) >> 4u) | ((byte(s + j) >> 6u) << 4u);
    return vec2<f32>(f32(sc), f32(mn));
}

// Values per block (.x) and bytes per block (.y) of ggml type t.
fn block_shape(t: u32) -> vec2<u32> {
    switch t {
        case 0u: { return vec2<u32>(1u, 4u); }
        case 1u, 30u: { return vec2<u32>(1u, 2u); }
        case 2u: { return vec2<u32>(32u, 18u); }
        case 3u: { return vec2<u32>(32u, 20u); }
        case 6u: { return vec2<u32>(32u, 22u); }
        case 7u: { return vec2<u32>(32u, 24u); }
        case 8u: { return vec2<u32>(32u, 34u); }
        case 12u: { return vec2<u32>(256u, 144u); }
        case 13u: { return vec2<u32>(256u, 176u); }
        default: { return vec2<u32>(256u, 210u); }
    }
}

// Value e of the block at byte b of ggml type t.
fn value(t: u32, b: u32, e: u32) -> f32 {
    switch t {
        case 0u: { return bitcast<f32>(word(b)); }
        case 1u: { return half(b); }
        case 30u: { return bitcast<f32>((byte(b) | (byte(b + 1u) << 8u)) << 16u); }
        case 8u: { return half(b) * f32(bitcast<i32>(byte(b + 2u + e) << 24u) >> 24u); }
        case 2u: { return half(b) * (f32(nibble(b + 2u, e)) - 8.0); }
        case 3u: { return half(b) * f32(nibble(b + 4u, e)) + half(b + 2u); }
        case 6u: { return half(b) * (f32(nibble(b + 6u, e) | (((word(b + 2u) >> e) & 1u) << 4u)) - 16.0); }
        case 7u: { return half(b) * f32(nibble(b + 8u, e) | (((word(b + 4u) >> e) & 1u) << 4u)) + half(b + 2u); }
        case 12u, 13u: {
            // Chunk c of 64 values: sub-block 2c in the low nibbles of its 32 bytes, 2c + 1 in the high ones.
            let c = e / 64u;
            let l = e % 64u;
            let j = 2u * c + l / 32u;
            var qs = b + 16u;
            var high = 0u;
            if (t == 13u) {
                qs = b + 48u;
                high = ((byte(b + 16u + l % 32u) >> j) & 1u) << 4u;
            }
            let q = byte(qs + 32u * c + l % 32u);
            var low = q & 15u;
            if (l >= 32u) {
                low = q >> 4u;
            }
            let sm = scale_min(j, b + 4u);
            return half(b) * sm.x * f32(low | high) - half(b + 2u) * sm.y;
        }
        default: {
            // Q6_K: half h of 128 values, block t of 32 in it; 4 low bits from ql, 2 high from qh, 16-value scales.
            let h = e / 128u;
            let r = e % 128u;
            let tt = r / 32u;
            let l = r % 32u;
            let ql = byte(b + 64u * h + 32u * (tt % 2u) + l);
            var low = ql & 15u;
            if (tt >= 2u) {
                low = ql >> 4u;
            }
            let hi = (byte(b + 128u + 32u * h + l) >> (2u * tt)) & 3u;
            let sc = f32(bitcast<i32>(byte(b + 192u + 8u * h + 2u * tt + l / 16u) << 24u) >> 24u);
            return half(b + 208u) * sc * (f32(low | (hi << 4u)) - 32.0);
        }
    }
}

// Σ_e value(t, b, e) · x[xs + e] over the block at byte b: the block's scales read once, the codes a word at a time
// where the format keeps them word-aligned relative to the block (the rest through `value`).
fn block_dot(t: u32, b: u32, xs: u32) -> f32 {
    switch t {
        case 8u: {
            let d = half(b);
            var sum = 0.0;
            for (var e = 0u; e < 32u; e++) {
                sum += f32(bitcast<i32>(byte(b + 2u + e) << 24u) >> 24u) * x[xs + e];
            }
            return d * sum;
        }
        case 2u, 3u, 6u, 7u: {
            // q = nibble | fifth bit << 4; y = d · (q − zero) + m.
            var qs = b + 2u;
            var zero = 8.0;
            var m = 0.0;
            var qh = 0u;
            if (t == 3u) { qs = b + 4u; zero = 0.0; m = half(b + 2u); }
            if (t == 6u) { qs = b + 6u; zero = 16.0; qh = word(b + 2u); }
            if (t == 7u) { qs = b + 8u; zero = 0.0; m = half(b + 2u); qh = word(b + 4u); }
            var sum = 0.0;
            var xsum = 0.0;
            for (var e = 0u; e < 16u; e++) {
                let q = byte(qs + e);
                let lo = f32((q & 15u) | (((qh >> e) & 1u) << 4u)) - zero;
                let hi = f32((q >> 4u) | (((qh >> (e + 16u)) & 1u) << 4u)) - zero;
                let x0 = x[xs + e];
                let x1 = x[xs + e + 16u];
                sum += lo * x0 + hi * x1;
                xsum += x0 + x1;
            }
            return half(b) * sum + m * xsum;
        }
        case 12u, 13u: {
            let d = half(b);
            let dmin = half(b + 2u);
            var total = 0.0;
            for (var j = 0u; j < 8u; j++) {
                let sm = scale_min(j, b + 4u);
                let c = j / 2u;
                var qs = b + 16u + 32u * c;
                if (t == 13u) { qs = b + 48u + 32u * c; }
                var sum = 0.0;
                var xsum = 0.0;
                for (var l = 0u; l < 32u; l++) {
                    var q = byte(qs + l);
                    if ((j & 1u) == 1u) { q = q >> 4u; } else { q = q & 15u; }
                    if (t == 13u) { q = q | (((byte(b + 16u + l) >> j) & 1u) << 4u); }
                    let xv = x[xs + 32u * j + l];
                    sum += f32(q) * xv;
                    xsum += xv;
                }
                total += d * sm.x * sum - dmin * sm.y * xsum;
            }
            return total;
        }
        case 14u: {
            let d = half(b + 208u);
            var total = 0.0;
            for (var h = 0u; h < 2u; h++) {
                for (var tt = 0u; tt < 4u; tt++) {
                    for (var half16 = 0u; half16 < 2u; half16++) {
                        let sc = f32(bitcast<i32>(byte(b + 192u + 8u * h + 2u * tt + half16) << 24u) >> 24u);
                        var sum = 0.0;
                        for (var l = 16u * half16; l < 16u * half16 + 16u; l++) {
                            let ql = byte(b + 64u * h + 32u * (tt % 2u) + l);
                            var low = ql & 15u;
                            if (tt >= 2u) { low = ql >> 4u; }
                            let hi = (byte(b + 128u + 32u * h + l) >> (2u * tt)) & 3u;
                            sum += (f32(low | (hi << 4u)) - 32.0) * x[xs + 128u * h + 32u * tt + l];
                        }
                        total += d * sc * sum;
                    }
                }
            }
            return total;
        }
        default: {
            return value(t, b, 0u) * x[xs];
        }
    }
}

@compute @workgroup_size(64, 1, 1)
fn main(@builtin(global_invocation_id) id: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let n = info[0];
    let k = info[1];
    let m = info[2];
    let parts = info[3];
    let item = id.x + id.y * groups.x * 64u;
    if (ROWS_MODE) {
        // Row r of the output: W's row ids[r].
        if (item >= n) {
            return;
        }
        let at = row_start(bitcast<u32>(x[item]), parts);
        let shape = block_shape(at.x);
        for (var e = 0u; e < k; e++) {
            y[item * k + e] = value(at.x, at.y + (e / shape.x) * shape.y, e % shape.x);
        }
        return;
    }
    // y[i, j] for item = i · m + j: one row of x against one row of W, so an invocation loops over k values at
    // most (llvmpipe stops one after 65,535 loop iterations).
    if (item >= n * m) {
        return;
    }
    let i = item / m;
    let j = item % m;
    let at = row_start(j, parts);
    let shape = block_shape(at.x);
    let blocks = k / shape.x;
    var acc = 0.0;
    for (var block = 0u; block < blocks; block++) {
        acc += block_dot(at.x, at.y + block * shape.y, i * k + block * shape.x);
    }
    y[item] = acc;
}

// Row j's ggml type (.x) and first byte (.y).
fn row_start(j: u32, parts: u32) -> vec2<u32> {
    var first = 0u;
    var start = 0u;
    for (var p = 0u; p < parts; p++) {
        let t = info[4u + 3u * p];
        let rows = info[5u + 3u * p];
        let row_bytes = info[6u + 3u * p];
        if (j < first + rows) {
            return vec2<u32>(t, start + (j - first) * row_bytes);
        }
        first += rows;
        start += rows * row_bytes;
    }
    return vec2<u32>(0u, 0u);
}
