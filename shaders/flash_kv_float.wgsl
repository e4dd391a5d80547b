// Keys and values as floats (Elem: f32 or f16) for flash_decode.wgsl, read as f32: contiguous [B, Hkv, Tk, D], or page pools [N, Hkv, P, D] where token j
// of batch row b is at slot j mod P of page table[b][⌊j / P⌋] (info[12] = P, the table after the key lengths).
// Read a vec4 at a time: a row starts at a multiple of D, itself a multiple of 4.
@group(0) @binding(5) var<storage, read_write> k: array<vec4<Elem>>;
@group(0) @binding(6) var<storage, read_write> v: array<vec4<Elem>>;

// The element offset of key j of KV head g in batch row b.
fn key_row(b: u32, g: u32, j: u32) -> u32 {
    let hkv = info[2]; let tk = info[4]; let d = info[5]; let page = info[12];
    if (page == 0u) { return ((b * hkv + g) * tk + j) * d; }
    let pages_per_row = (tk + page - 1u) / page;
    let physical = info[13u + info[0] + b * pages_per_row + j / page];
    return ((physical * hkv + g) * page + j % page) * d;
}

// Elements 4x … 4x + 3 of the key (value) row at `row`.
fn key_vec4(row: u32, x: u32) -> vec4<f32> { return vec4<f32>(k[row / 4u + x]); }

fn value_vec4(row: u32, x: u32) -> vec4<f32> { return vec4<f32>(v[row / 4u + x]); }
