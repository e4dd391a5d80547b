//! How the tiled WGSL kernels spread rows over lanes in each [`KernelTier`], and the per-row code they unroll at
//! build time: every (row, vec4) pair of a lane is a named WGSL variable, so nothing is indexed at run time.

use std::fmt::Write;

use super::KernelTier;

/// WebGPU's portable workgroup memory.
const PORTABLE_BYTES: usize = 16384;
/// Workgroup memory the subgroup tier's tiles take at most (where the adapter allows it).
const SUBGROUP_BYTES: usize = 32768;

/// A tiled kernel's layout: groups of `lanes` lanes own `rows` rows each, lane λ holding the vec4s x·lanes + λ.
#[derive(Clone, Copy, Debug)]
pub struct Geometry {
    pub lanes: u32,
    pub rows: u32,
    pub threads: u32,
    /// Keys (or queries) per tile in workgroup memory, a multiple of `chunk`.
    pub tile: u32,
    /// Keys scored at once, between two rescales.
    pub chunk: u32,
    /// vec4s of a head row.
    pub vec4s: u32,
}

impl Geometry {
    /// The layout of `tier` for head width d on an adapter with `workgroup_bytes` of workgroup memory.
    pub fn new(tier: KernelTier, d: usize, workgroup_bytes: usize) -> Self {
        let vec4s = d as u32 / 4;
        let (lanes, rows, threads, budget) = match tier {
            KernelTier::Portable => (1, 1, 64, PORTABLE_BYTES),
            // d 64 → 4 lanes of 4 vec4s, d 128 → 8 lanes of 4; two rows per group.
            KernelTier::Subgroup => {
                let lanes = [8, 4, 2].into_iter().find(|&g| vec4s % g == 0 && vec4s / g >= 4).unwrap_or(1);
                (lanes, 2, 128, workgroup_bytes.clamp(PORTABLE_BYTES, SUBGROUP_BYTES))
            }
        };
        // Two tiles of `tile` rows of d floats, and the block's range (a vec2<u32>), within the budget.
        let keys = ((budget - 16) / (8 * d)) as u32;
        let chunk = if keys >= 8 { 8 } else { 4 };
        Self { lanes, rows, threads, tile: keys / chunk * chunk, chunk, vec4s }
    }

    /// Rows per workgroup.
    pub fn block(&self) -> u32 {
        self.threads / self.lanes * self.rows
    }

    /// vec4s of a row that each lane holds.
    fn per_lane(&self) -> u32 {
        self.vec4s / self.lanes
    }

    /// The shader's size placeholders.
    pub fn values(&self) -> Vec<(&'static str, String)> {
        vec![
            ("lanes", self.lanes.to_string()),
            ("rows", self.rows.to_string()),
            ("threads", self.threads.to_string()),
            ("block", self.block().to_string()),
            ("tile", self.tile.to_string()),
            ("chunk", self.chunk.to_string()),
            ("vec4s", self.vec4s.to_string()),
            ("tile_vec4s", (self.tile * self.vec4s).to_string()),
        ]
    }

    /// Element x of the lane's share of a row starting at vec4 `base`: vec4 base + x·lanes + λ.
    fn at(&self, base: &str, x: u32) -> String {
        format!("{base} + {}u + lane", x * self.lanes)
    }

    /// `total += subgroupShuffleXor(total, m)` for m = 1, 2, … < lanes: the group's partial sums, summed.
    fn reduce(&self, var: &str) -> String {
        let mut code = String::new();
        let mut mask = 1;
        while mask < self.lanes {
            let _ = write!(code, "{var} += subgroupShuffleXor({var}, {mask}u); ");
            mask *= 2;
        }
        code
    }

    /// The forward kernel's placeholders: `row_setup` (the group's rows, q scaled, m, ℓ, u, the key range [lo, hi)),
    /// `chunk_code` (score `chunk` keys, rescale once, accumulate) and `row_finish` (o = u / ℓ, lse = m + ln ℓ).
    pub fn forward(&self) -> Vec<(&'static str, String)> {
        let (rows, x_count) = (0..self.rows, 0..self.per_lane());
        let mut setup = String::new();
        for r in rows.clone() {
            let _ = writeln!(setup, "let row{r} = packed_row(c, b, kvh, min(first + {r}u, rows - 1u));");
            let _ = writeln!(setup, "let range{r} = row_keys(c, b, row{r}.y);");
            let _ = writeln!(setup, "var m{r} = -3.0e38; var l{r} = 0.0;");
            for x in x_count.clone() {
                let at = self.at(&format!("row{r}.x * V"), x);
                let _ = writeln!(setup, "let q{r}_{x} = q[{at}] * c.scale; var u{r}_{x} = vec4<f32>(0.0);");
            }
        }
        let ends = |field: &str, f: &str| {
            rows.clone().map(|r| format!("range{r}.{field}")).reduce(|a, b| format!("{f}({a}, {b})")).unwrap()
        };
        let _ = writeln!(setup, "let lo = {}; let hi = {};", ends("x", "min"), ends("y", "max"));

        let quads = self.chunk / 4;
        let mut chunk = String::new();
        for j in 0..self.chunk {
            for x in x_count.clone() {
                let _ = writeln!(chunk, "let k{j}_{x} = k_tile[{}];", self.at(&format!("(j0 + {j}u) * V"), x));
            }
            for r in rows.clone() {
                let dot = x_count.clone().map(|x| format!("dot(q{r}_{x}, k{j}_{x})")).collect::<Vec<_>>();
                let _ = writeln!(chunk, "let sc{r}_{j} = {};", dot.join(" + "));
            }
        }
        for r in rows.clone() {
            for k in 0..quads {
                let s = format!("s{r}_{k}");
                let scores = (0..4).map(|e| format!("sc{r}_{}", 4 * k + e)).collect::<Vec<_>>().join(", ");
                let _ = writeln!(chunk, "var {s} = vec4<f32>({scores}); {}", self.reduce(&s));
                let j = format!("jv + vec4<u32>({}u)", 4 * k);
                let _ = writeln!(
                    chunk,
                    "let vis{r}_{k} = ({j} >= vec4<u32>(range{r}.x)) & ({j} < vec4<u32>(range{r}.y)); \
                     let ms{r}_{k} = select(vec4<f32>(-3.0e38), {s}, vis{r}_{k});"
                );
            }
            let maxes = (0..quads)
                .map(|k| format!("max(max(ms{r}_{k}.x, ms{r}_{k}.y), max(ms{r}_{k}.z, ms{r}_{k}.w))"))
                .fold(format!("m{r}"), |a, b| format!("max({a}, {b})"));
            let _ = writeln!(chunk, "let mx{r} = {maxes}; let corr{r} = exp(m{r} - mx{r});");
            let mut sum = Vec::new();
            for k in 0..quads {
                let _ = writeln!(
                    chunk,
                    "let p{r}_{k} = select(vec4<f32>(0.0), exp(s{r}_{k} - vec4<f32>(mx{r})), vis{r}_{k});"
                );
                sum.push(format!("p{r}_{k}"));
            }
            let _ = writeln!(chunk, "l{r} = l{r} * corr{r} + dot({}, vec4<f32>(1.0)); m{r} = mx{r};", sum.join(" + "));
            for x in x_count.clone() {
                let _ = writeln!(chunk, "u{r}_{x} *= corr{r};");
            }
        }
        for j in 0..self.chunk {
            for x in x_count.clone() {
                let _ = write!(chunk, "{{ let w = v_tile[{}];", self.at(&format!("(j0 + {j}u) * V"), x));
                for r in rows.clone() {
                    let _ = write!(chunk, " u{r}_{x} += p{r}_{}.{} * w;", j / 4, ["x", "y", "z", "w"][j as usize % 4]);
                }
                let _ = writeln!(chunk, " }}");
            }
        }

        let mut finish = String::new();
        for r in rows {
            let _ = writeln!(finish, "if (first + {r}u < rows) {{");
            let _ = writeln!(finish, "    let seen = l{r} > 0.0;");
            for x in x_count.clone() {
                let at = self.at(&format!("row{r}.x * V"), x);
                let _ = writeln!(finish, "    o[{at}] = select(vec4<f32>(0.0), u{r}_{x} / l{r}, seen);");
            }
            let _ = writeln!(finish, "    if (lane == 0u) {{ lse[row{r}.x] = select(0.0, m{r} + log(l{r}), seen); }}");
            let _ = writeln!(finish, "}}");
        }
        let mut values = self.values();
        values.extend([("row_setup", setup), ("chunk_code", chunk), ("row_finish", finish)]);
        values
    }
}
