//! Products of several rows of x (a prompt, a batch) with packed W in 8-bit integers, on AVX-512 VNNI: each chunk of
//! W's rows is unpacked once into tiles of 16 rows × 32 columns laid out for `vpdpbusd` on 512-bit vectors, so one
//! instruction multiplies 4 consecutive codes of x (broadcast) with the same 4 codes of 16 rows of W and adds them
//! into those 16 rows' sums, with no horizontal sums. x's codes enter as unsigned bytes, q_x + 128; each tile holds −128 Σ q_w per half block
//! to take the 128 back out, so the integer sums equal Σ q_x q_w of the module comment above.

use ember_formats::ggml::Format;

use super::codes::{Codes, unpack_row};
use super::quantize::Activations;
use std::arch::x86_64::*;

/// Rows of W per tile: one i32 lane each of a 512-bit vector.
pub(super) const ROWS: usize = 16;

/// Rows of x multiplied together with each tile (their sums stay in registers across W's blocks).
const GROUP: usize = 4;

/// 16 rows of W over one block of 32 columns: code group g (columns 4g..4g + 4) of row r at bytes 4r..4r + 4 of
/// `codes[g]`; per half block h and row r, the scale a_h, offset m_h and −128 Σ q over the half.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
pub(super) struct Tile {
    codes: [[i8; 4 * ROWS]; 8],
    scales: [[f32; ROWS]; 2],
    mins: [[f32; ROWS]; 2],
    offsets: [[i32; ROWS]; 2],
}

const ZERO: Tile =
    Tile { codes: [[0; 4 * ROWS]; 8], scales: [[0.0; ROWS]; 2], mins: [[0.0; ROWS]; 2], offsets: [[0; ROWS]; 2] };

/// W's rows (format and bytes) as tiles, tile t over block b at `t · blocks + b`; rows past the last are zero.
pub(super) fn pack<'a>(rows: impl Iterator<Item = (Format, &'a [u8])>, blocks: usize, tiles: &mut Vec<Tile>) {
    let mut codes = vec![Codes::default(); blocks];
    tiles.clear();
    for (i, (format, row)) in rows.enumerate() {
        let lane = i % ROWS;
        if lane == 0 {
            tiles.resize(tiles.len() + blocks, ZERO);
        }
        unpack_row(format, row, &mut codes);
        let first = tiles.len() - blocks;
        for (tile, c) in tiles[first..].iter_mut().zip(&codes) {
            for (g, group) in tile.codes.iter_mut().enumerate() {
                group[4 * lane..4 * lane + 4].copy_from_slice(&c.q[4 * g..4 * g + 4]);
            }
            for h in 0..2 {
                tile.scales[h][lane] = c.a[h];
                tile.mins[h][lane] = c.m[h];
                tile.offsets[h][lane] = -128 * c.q[16 * h..16 * h + 16].iter().map(|&q| q as i32).sum::<i32>();
            }
        }
    }
}

/// x's codes as the unsigned bytes q_x + 128.
pub(super) fn unsigned(acts: &Activations) -> Vec<u8> {
    acts.q.iter().map(|&q| q as u8 ^ 0x80).collect()
}

/// out [n, rows] = x Wᵀ for the `rows` rows of W in `tiles`, x as [`unsigned`] codes `xu` with `acts`' scales and
/// sums. `SPLIT` when a scale differs between the halves of a block (Q6_K); otherwise both halves share row h = 0's.
#[target_feature(enable = "avx2,fma,avx512f,avx512bw,avx512vnni")]
pub(super) fn multiply<const SPLIT: bool>(tiles: &[Tile], xu: &[u8], acts: &Activations, rows: usize, out: &mut [f32]) {
    let blocks = acts.blocks;
    let n = out.len() / rows;
    for (t, tiles) in tiles.chunks_exact(blocks).enumerate() {
        let lanes = ROWS.min(rows - t * ROWS);
        let mut store = |first: usize, sums: &[[f32; ROWS]]| {
            for (r, sums) in sums.iter().enumerate() {
                out[(first + r) * rows + t * ROWS..][..lanes].copy_from_slice(&sums[..lanes]);
            }
        };
        let mut first = 0;
        while first + GROUP <= n {
            store(first, &group::<GROUP, SPLIT>(tiles, xu, acts, first));
            first += GROUP;
        }
        for r in first..n {
            store(r, &group::<1, SPLIT>(tiles, xu, acts, r));
        }
    }
}

/// The 16 rows of one tile column (`tiles`, one per block) against rows first..first + R of x.
#[inline(always)]
fn group<const R: usize, const SPLIT: bool>(
    tiles: &[Tile],
    xu: &[u8],
    acts: &Activations,
    first: usize,
) -> [[f32; ROWS]; R] {
    let (blocks, k) = (acts.blocks, acts.blocks * 32);
    // SAFETY (all intrinsics below): the caller is compiled with AVX2, FMA and AVX-512 F/BW/VNNI, which the CPU
    // has; the tile loads read 64-byte-aligned arrays of 64 bytes.
    unsafe {
        let mut acc = [_mm512_setzero_ps(); R];
        for (b, tile) in tiles.iter().enumerate() {
            let w: [__m512i; 8] = std::array::from_fn(|g| _mm512_load_si512(tile.codes[g].as_ptr().cast()));
            let load = |v: &[f32; ROWS]| _mm512_load_ps(v.as_ptr());
            let offsets = tile.offsets.map(|o| _mm512_load_si512(o.as_ptr().cast()));
            for (i, acc) in acc.iter_mut().enumerate() {
                let row = first + i;
                let x = &xu[row * k + 32 * b..][..32];
                let word = |g: usize| {
                    _mm512_set1_epi32(i32::from_le_bytes([x[4 * g], x[4 * g + 1], x[4 * g + 2], x[4 * g + 3]]))
                };
                let (mut low, mut high) = (offsets[0], offsets[1]);
                for g in 0..4 {
                    low = _mm512_dpbusd_epi32(low, word(g), w[g]);
                    high = _mm512_dpbusd_epi32(high, word(g + 4), w[g + 4]);
                }
                let [d, whole, s0, s1] = acts.scales[row * blocks + b];
                let dx = _mm512_set1_ps(d);
                if SPLIT {
                    *acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(low), _mm512_mul_ps(load(&tile.scales[0]), dx), *acc);
                    *acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(high), _mm512_mul_ps(load(&tile.scales[1]), dx), *acc);
                    *acc = _mm512_fmadd_ps(load(&tile.mins[0]), _mm512_set1_ps(s0), *acc);
                    *acc = _mm512_fmadd_ps(load(&tile.mins[1]), _mm512_set1_ps(s1), *acc);
                } else {
                    let sum = _mm512_cvtepi32_ps(_mm512_add_epi32(low, high));
                    *acc = _mm512_fmadd_ps(sum, _mm512_mul_ps(load(&tile.scales[0]), dx), *acc);
                    *acc = _mm512_fmadd_ps(load(&tile.mins[0]), _mm512_set1_ps(whole), *acc);
                }
            }
        }
        acc.map(|a| std::mem::transmute::<__m512, [f32; ROWS]>(a))
    }
}
