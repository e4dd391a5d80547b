// f32 keys and values for flash_decode.wgsl: contiguous [B, Hkv, Tk, D], or page pools [N, Hkv, P, D] where token j
// of batch row b is at slot j mod P of page table[b][⌊j / P⌋] (info[12] = P, the table after the key lengths).
@group(0) @binding(5) var<storage, read_write> k: array<f32>;
@group(0) @binding(6) var<storage, read_write> v: array<f32>;

fn key_row(b: u32, g: u32, j: u32) -> u32 {
    let hkv = info[2]; let tk = info[4]; let d = info[5]; let page = info[12];
    if (page == 0u) { return ((b * hkv + g) * tk + j) * d; }
    let pages_per_row = (tk + page - 1u) / page;
    let physical = info[13u + info[0] + b * pages_per_row + j / page];
    return ((physical * hkv + g) * page + j % page) * d;
}

fn key_at(row: u32, e: u32) -> f32 { return k[row + e]; }

fn value_at(row: u32, e: u32) -> f32 { return v[row + e]; }
