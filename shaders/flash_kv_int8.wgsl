// int8 keys and values for flash_decode.wgsl, token-major [B, Tk, Hkv·D] as serve's quantized store keeps them:
// four codes per u32 (little-endian bytes), one f32 scale per GROUP consecutive values, x̂ = s · q.
// Read a vec4 at a time: a row starts at a multiple of D, itself a multiple of 4, so a vec4 is one word of codes.
@group(0) @binding(5) var<storage, read_write> k_codes: array<u32>;
@group(0) @binding(6) var<storage, read_write> k_scales: array<f32>;
@group(0) @binding(7) var<storage, read_write> v_codes: array<u32>;
@group(0) @binding(8) var<storage, read_write> v_scales: array<f32>;

const GROUP: u32 = {{ group }}u;

// The element offset of key j of KV head g in batch row b.
fn key_row(b: u32, g: u32, j: u32) -> u32 {
    let hkv = info[2]; let tk = info[4]; let d = info[5];
    return ((b * tk + j) * hkv + g) * d;
}

// The four signed bytes of a word of codes, lowest first, sign-extended by an arithmetic shift.
fn codes(word: u32) -> vec4<f32> {
    let bytes = vec4<u32>(word) << vec4<u32>(24u, 16u, 8u, 0u);
    return vec4<f32>(bitcast<vec4<i32>>(bytes) >> vec4<u32>(24u));
}

// Dequantized elements i … i + 3 of the keys: one scale when GROUP is a multiple of 4 (i is), else one each.
fn key_vec4_at(i: u32) -> vec4<f32> {
    if (GROUP % 4u == 0u) { return codes(k_codes[i / 4u]) * k_scales[i / GROUP]; }
    let s = vec4<f32>(k_scales[i / GROUP], k_scales[(i + 1u) / GROUP], k_scales[(i + 2u) / GROUP],
                      k_scales[(i + 3u) / GROUP]);
    return codes(k_codes[i / 4u]) * s;
}

// The same for the values.
fn value_vec4_at(i: u32) -> vec4<f32> {
    if (GROUP % 4u == 0u) { return codes(v_codes[i / 4u]) * v_scales[i / GROUP]; }
    let s = vec4<f32>(v_scales[i / GROUP], v_scales[(i + 1u) / GROUP], v_scales[(i + 2u) / GROUP],
                      v_scales[(i + 3u) / GROUP]);
    return codes(v_codes[i / 4u]) * s;
}

// Elements 4x … 4x + 3 of the key (value) row at `row`.
fn key_vec4(row: u32, x: u32) -> vec4<f32> { return key_vec4_at(row + 4u * x); }

fn value_vec4(row: u32, x: u32) -> vec4<f32> { return value_vec4_at(row + 4u * x); }
