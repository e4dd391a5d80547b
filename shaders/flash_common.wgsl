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

// Packed query rows of a KV head: its GQA group's g query heads × Tq positions.
fn packed_rows(c: Call) -> u32 {
    return c.hq / c.hkv * c.tq;
}

// Packed row n of KV head kvh in batch row b, n = t·g + r for query head r of the GQA group of g: the row's index
// in [B, Hq, Tq] and its position t.
fn packed_row(c: Call, b: u32, kvh: u32, n: u32) -> vec2<u32> {
    let g = c.hq / c.hkv;
    let t = n / g;
    return vec2<u32>((b * c.hq + kvh * g + n % g) * c.tq + t, t);
}

// Keys [lo, hi) that some of the packed rows first ..= last of KV head kvh see: the first row's lo to the last row's
// hi, as both ends grow with the row.
fn keys_seen(c: Call, b: u32, kvh: u32, first: u32, last: u32) -> vec2<u32> {
    return vec2<u32>(row_keys(c, b, packed_row(c, b, kvh, first).y).x, row_keys(c, b, packed_row(c, b, kvh, last).y).y);
}

// The online softmax (FlashAttention's update). A row keeps its running maximum m, ℓ = Σ_j e^(s_j − m) and
// u = Σ_j e^(s_j − m) v_j over the keys scored so far. A chunk of scores s raises the maximum to m' = max(m, max_j s_j),
// rescales what is kept by α = e^(m − m') and adds p_j = e^(s_j − m'):  ℓ' = α ℓ + Σ_j p_j,  u' = α u + Σ_j p_j v_j.
// At the end o = u / ℓ and lse = m + ln ℓ; the backward recomputes p_j = e^(s_j − lse) from the saved lse.

const MASKED: f32 = -3.0e38;   // a score no key reaches: the maximum of a row that has seen nothing

// m' = max(m, max_j s_j) over the quad's keys the row sees.
fn raised_max(m: f32, s: vec4<f32>, seen: vec4<bool>) -> f32 {
    let x = select(vec4<f32>(MASKED), s, seen);
    return max(m, max(max(x.x, x.y), max(x.z, x.w)));
}

// p_j = e^(s_j − m_j) for the quad's keys the row sees, 0 for the others.
fn weights(s: vec4<f32>, m: vec4<f32>, seen: vec4<bool>) -> vec4<f32> {
    return select(vec4<f32>(0.0), exp(s - m), seen);
}

// ℓ' = α ℓ + Σ_j p_j.
fn rescaled_sum(l: f32, alpha: f32, p: vec4<f32>) -> f32 {
    return l * alpha + dot(p, vec4<f32>(1.0));
}

// o = u / ℓ; 0 for a row that sees no key.
fn normalized(u: vec4<f32>, l: f32) -> vec4<f32> {
    return select(vec4<f32>(0.0), u / l, l > 0.0);
}

// lse = m + ln ℓ; 0 for a row that sees no key.
fn log_sum_exp(m: f32, l: f32) -> f32 {
    return select(0.0, m + log(l), l > 0.0);
}

// The softmax's backward: ds_j = p_j (dp_j − D) with dp_j = dO · v_j and D = rowsum(dO ⊙ o).
fn score_grad(p: vec4<f32>, dp: vec4<f32>, delta: vec4<f32>) -> vec4<f32> {
    return p * (dp - delta);
}
