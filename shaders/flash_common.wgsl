// Shared by the attention kernels (pasted in at the `common` placeholder): the call's sizes from `info`, and
// which keys a query row sees. info = [B, Hq, Hkv, Tq, Tk, D, bits(scale), causal, query_offset, window (0: none),
// split, splits, page size (0: contiguous), key_length[B], page table [B, ⌈Tk / P⌉] when paged].

struct Call {
    batch: u32,
    hq: u32,
    hkv: u32,
    tq: u32,
    tk: u32,
    d: u32,
    scale: f32,
    causal: bool,
    offset: u32,
    window: u32,
}

fn call() -> Call {
    return Call(info[0], info[1], info[2], info[3], info[4], info[5], bitcast<f32>(info[6]), info[7] != 0u, info[8],
                info[9]);
}

// Keys [lo, hi) that query row i of batch row b sees: j < key_length[b]; causal: j ≤ offset + i;
// window w: j > offset + i − w. Both ends grow with i.
fn row_keys(c: Call, b: u32, i: u32) -> vec2<u32> {
    let pos = c.offset + i;
    var hi = min(info[13u + b], c.tk);
    if (c.causal) { hi = min(hi, pos + 1u); }
    var lo = 0u;
    if (c.window > 0u && pos + 1u > c.window) { lo = pos + 1u - c.window; }
    return vec2<u32>(lo, max(lo, hi));
}

// Query rows [lo, hi) that see key j of batch row b (the same masks, solved for i). Both ends grow with j.
fn key_queries(c: Call, b: u32, j: u32) -> vec2<u32> {
    var lo = 0u;
    if (c.causal && j > c.offset) { lo = min(j - c.offset, c.tq); }
    var hi = select(0u, c.tq, j < min(info[13u + b], c.tk));
    if (c.window > 0u) { hi = min(hi, select(0u, j + c.window - c.offset, j + c.window > c.offset)); }
    return vec2<u32>(lo, max(lo, hi));
}

// Packed row n of KV head kvh in batch row b, n = t·g + r for query head r of the GQA group of g: the row's index
// in [B, Hq, Tq] and its position t.
fn packed_row(c: Call, b: u32, kvh: u32, n: u32) -> vec2<u32> {
    let g = c.hq / c.hkv;
    let t = n / g;
    return vec2<u32>((b * c.hq + kvh * g + n % g) * c.tq + t, t);
}
