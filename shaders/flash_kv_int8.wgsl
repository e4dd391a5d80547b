// int8 keys and values for flash_decode.wgsl, token-major [B, Tk, Hkv·D] as serve's quantized store keeps them:
// four codes per u32 (little-endian bytes), one f32 scale per GROUP consecutive values, x̂ = s · q.
@group(0) @binding(5) var<storage, read_write> k_codes: array<u32>;
@group(0) @binding(6) var<storage, read_write> k_scales: array<f32>;
@group(0) @binding(7) var<storage, read_write> v_codes: array<u32>;
@group(0) @binding(8) var<storage, read_write> v_scales: array<f32>;

const GROUP: u32 = {{ group }}u;

fn key_row(b: u32, g: u32, j: u32) -> u32 {
    let hkv = info[2]; let tk = info[4]; let d = info[5];
    return ((b * tk + j) * hkv + g) * d;
}

// The signed byte at `index` of packed codes.
fn code(word: u32, index: u32) -> f32 {
    return f32(bitcast<i32>(word << (24u - 8u * (index % 4u))) >> 24u);
}

fn key_at(row: u32, e: u32) -> f32 {
    let i = row + e;
    return code(k_codes[i / 4u], i) * k_scales[i / GROUP];
}

fn value_at(row: u32, e: u32) -> f32 {
    let i = row + e;
    return code(v_codes[i / 4u], i) * v_scales[i / GROUP];
}
