//! How the tiled WGSL kernels spread rows over lanes in each [`KernelTier`], and the per-row code they unroll at
//! build time: every (row, vec4) pair of a lane is a named WGSL variable, so nothing is indexed at run time.

use std::fmt::Write;

use crate::spec::KernelTier;

/// WebGPU's portable workgroup memory.
const PORTABLE_BYTES: usize = 16384;
/// Workgroup memory the subgroup tier's tiles take at most (where the adapter allows it).
const SUBGROUP_BYTES: usize = 32768;

/// flash_queries.wgsl's bindings after q, k and v: the forward's o and lse, or a split's partial states for the merge
/// kernel; dq's inputs and output.
const OUTPUTS: &str = "\
@group(0) @binding(3) var<storage, read_write> o: array<vec4<Elem>>;       // [B, Hq, Tq, D]
@group(0) @binding(4) var<storage, read_write> lse: array<f32>;            // [B, Hq, Tq]
@group(0) @binding(5) var<storage, read_write> info: array<u32>;";
const SPLIT_OUTPUTS: &str = "\
@group(0) @binding(3) var<storage, read_write> part_m: array<f32>;         // [B·Hq·Tq, splits]
@group(0) @binding(4) var<storage, read_write> part_l: array<f32>;         // [B·Hq·Tq, splits]
@group(0) @binding(5) var<storage, read_write> part_u: array<vec4<f32>>;   // [B·Hq·Tq, splits, D]
@group(0) @binding(6) var<storage, read_write> info: array<u32>;";
const DQ_BINDINGS: &str = "\
@group(0) @binding(3) var<storage, read_write> d_o: array<vec4<Elem>>;     // [B, Hq, Tq, D]
@group(0) @binding(4) var<storage, read_write> lse: array<f32>;            // [B, Hq, Tq]
@group(0) @binding(5) var<storage, read_write> delta: array<f32>;          // [B, Hq, Tq]: D_i
@group(0) @binding(6) var<storage, read_write> dq: array<vec4<Elem>>;      // [B, Hq, Tq, D]
@group(0) @binding(7) var<storage, read_write> info: array<u32>;";

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
    /// Portable tier with several lanes per row: partial scores summed through workgroup memory (no subgroups), so
    /// every group walks every chunk of a tile and the exchange's barriers stay in uniform control flow.
    exchange: bool,
    /// dk/dv only: dq folded into the pass, and where it reads the block's K rows for it.
    fold: Option<KRows>,
}

/// Where dk/dv's pass, with dq folded in, reads the block's K rows for dq = scale · Σ ds k.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum KRows {
    /// Workgroup memory, written once from the groups' registers.
    Shared,
    /// The k buffer, where K in workgroup memory would leave a tile of fewer than 16 query rows.
    Buffer,
}

impl Geometry {
    /// The forward's (and dq's) layout in `tier` for head width d on an adapter with `workgroup_bytes` of workgroup
    /// memory: query rows over lanes, K and V tiles of `shared` bytes per value (2: f16, twice the keys per tile).
    pub fn queries(tier: KernelTier, d: usize, shared: usize, workgroup_bytes: usize) -> Self {
        Self::new(tier, d, workgroup_bytes, 2, 2 * shared * d, 0)
    }

    /// dk/dv's layout: one key row per group of lanes (it holds k, v, dk and dv), Q and dO tiles with lse and D. With
    /// `fold`, dq too: a chunk's ds for each key row in workgroup memory, and the block's K rows where a tile of 16
    /// query rows still fits beside them. A Q row and a dO row take `pair` bytes per value together.
    pub fn keys(tier: KernelTier, d: usize, pair: usize, workgroup_bytes: usize, fold: bool) -> Self {
        let tiles = |per_key: usize| Self::new(tier, d, workgroup_bytes, 1, pair * d + 8, per_key);
        if !fold {
            return tiles(0);
        }
        let shared = tiles(4 * 8 + 4 * d);
        if shared.tile >= 16 {
            Self { fold: Some(KRows::Shared), ..shared }
        } else {
            Self { fold: Some(KRows::Buffer), ..tiles(4 * 8) }
        }
    }

    /// Subgroup tier: d 64 → 4 lanes of 4 vec4s, d 128 → 8 lanes of 4, `pair` rows per group. Portable tier: one
    /// row per group, 64 groups; one lane per row below d = 128, two from there (16 vec4s each at d = 128; more lanes'
    /// exchange would leave 16 KiB no room for tiles at d = 256), exchanging partial scores in workgroup memory. Tiles of rows taking
    /// `row_bytes` each, with the block's range (a vec2<u32>), the exchange and `reserved` bytes for each row of the
    /// block, within the budget.
    fn new(tier: KernelTier, d: usize, workgroup_bytes: usize, pair: u32, row_bytes: usize, reserved: usize) -> Self {
        let vec4s = d as u32 / 4;
        let (lanes, rows, threads, budget) = match tier {
            KernelTier::Portable => {
                let lanes = if vec4s >= 32 && vec4s.is_multiple_of(2) { 2 } else { 1 };
                (lanes, 1, 64 * lanes, PORTABLE_BYTES)
            }
            KernelTier::Subgroup => {
                let lanes = [8, 4, 2].into_iter().find(|&g| vec4s.is_multiple_of(g) && vec4s / g >= 4).unwrap_or(1);
                (lanes, pair, 128, workgroup_bytes.clamp(PORTABLE_BYTES, SUBGROUP_BYTES))
            }
        };
        let exchange = tier == KernelTier::Portable && lanes > 1;
        let block = (threads / lanes * rows) as usize;
        // The exchange: each invocation's quads of one chunk (8 keys) for each of its rows.
        let exchanged = if exchange { threads as usize * rows as usize * 2 * 16 } else { 0 };
        let tile = (budget.saturating_sub(16 + exchanged + block * reserved) / row_bytes) as u32;
        let chunk = if tile >= 8 { 8 } else { 4 };
        Self { lanes, rows, threads, tile: tile / chunk * chunk, chunk, vec4s, exchange, fold: None }
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
            ("tile_quads", (self.tile / 4).to_string()),
            ("exchange_memory", self.exchange_memory()),
            ("geometry", self.constants()),
        ]
    }

    /// The layout as the shaders' WGSL constants.
    fn constants(&self) -> String {
        let named = [
            ("LANES", self.lanes),
            ("ROWS", self.rows),
            ("THREADS", self.threads),
            ("BLOCK", self.block()),
            ("TILE", self.tile),
            ("CHUNK", self.chunk),
            ("V", self.vec4s),
        ];
        named.map(|(name, value)| format!("const {name}: u32 = {value}u;")).join("\n")
    }

    /// Quads of partial scores an invocation exchanges per `dots`.
    fn exchanged(&self) -> u32 {
        self.rows * self.chunk / 4
    }

    /// The exchange's workgroup array, where the portable tier has several lanes per row.
    fn exchange_memory(&self) -> String {
        match self.exchange {
            true => format!("var<workgroup> exchange: array<vec4<f32>, {}>;", self.threads * self.exchanged()),
            false => String::new(),
        }
    }

    /// Element x of the lane's share of a row starting at vec4 `base`: vec4 base + x·lanes + λ.
    fn at(&self, base: &str, x: u32) -> String {
        format!("{base} + {}u + lane", x * self.lanes)
    }

    /// `total += subgroupShuffleXor(total, m)` for m = 1, 2, … < lanes: the group's partial sums, summed.
    fn reduce(&self, var: &str) -> String {
        let mut code = String::new();
        if self.exchange {
            return code;
        }
        let mut mask = 1;
        while mask < self.lanes {
            let _ = write!(code, "{var} += subgroupShuffleXor({var}, {mask}u); ");
            mask *= 2;
        }
        code
    }

    /// `let {name}{r}_{x} = {buffer}[…]{suffix};`: the lane's share of each of the group's rows (`row{r}.x` their
    /// row index) in f32; `shared`: rounded to the tiles' type first, as the other pass read the same rows.
    fn load(&self, code: &mut String, name: &str, buffer: &str, suffix: &str, shared: bool) {
        for r in 0..self.rows {
            for x in 0..self.per_lane() {
                let at = self.at(&format!("row{r}.x * V"), x);
                let value = if shared { format!("vec4<Shared>({buffer}[{at}])") } else { format!("{buffer}[{at}]") };
                let _ = writeln!(code, "let {name}{r}_{x} = vec4<f32>({value}){suffix};");
            }
        }
    }

    /// `var {name}{r}_{x} = 0`: an accumulator over the lane's share of each row.
    fn zero(&self, code: &mut String, name: &str) {
        for r in 0..self.rows {
            for x in 0..self.per_lane() {
                let _ = writeln!(code, "var {name}{r}_{x} = vec4<f32>(0.0);");
            }
        }
    }

    /// `let lo, hi`: the union of the rows' ranges `range{r}`, which chunks are scanned.
    fn union(&self, code: &mut String) {
        if self.exchange {
            // Every chunk, for uniform barriers; the masks keep each row to its own keys.
            let _ = writeln!(code, "let lo = 0u; let hi = 0xffffffffu;");
            return;
        }
        let ends = |field: &str, f: &str| {
            (0..self.rows).map(|r| format!("range{r}.{field}")).reduce(|a, b| format!("{f}({a}, {b})")).unwrap()
        };
        let _ = writeln!(code, "let lo = {}; let hi = {};", ends("x", "min"), ends("y", "max"));
    }

    /// `{out}{r}_{k}`: the dot products of row r's `held` with the chunk's tile rows 4k … 4k + 3 of `tile`, summed
    /// over the group's lanes.
    fn dots(&self, code: &mut String, out: &str, held: &str, tile: &str) {
        for j in 0..self.chunk {
            for x in 0..self.per_lane() {
                let at = self.at(&format!("(j0 + {j}u) * V"), x);
                let _ = writeln!(code, "let {out}t{j}_{x} = vec4<f32>({tile}[{at}]);");
            }
            for r in 0..self.rows {
                let terms = (0..self.per_lane()).map(|x| format!("dot({held}{r}_{x}, {out}t{j}_{x})"));
                let _ = writeln!(code, "let {out}s{r}_{j} = {};", pairwise(terms.collect()));
            }
        }
        for r in 0..self.rows {
            for k in 0..self.chunk / 4 {
                let quad = (0..4).map(|e| format!("{out}s{r}_{}", 4 * k + e)).collect::<Vec<_>>().join(", ");
                let var = format!("{out}{r}_{k}");
                let _ = writeln!(code, "var {var} = vec4<f32>({quad}); {}", self.reduce(&var));
            }
        }
        if self.exchange {
            self.exchange_partials(code, out);
        }
    }

    /// Without subgroups: each lane's partial quads to workgroup memory, then the group's other lanes' added to them.
    fn exchange_partials(&self, code: &mut String, out: &str) {
        let quads = self.exchanged();
        let var = |i: u32| format!("{out}{}_{}", i / (self.chunk / 4), i % (self.chunk / 4));
        for i in 0..quads {
            let _ = writeln!(code, "exchange[lid * {quads}u + {i}u] = {};", var(i));
        }
        let _ = writeln!(code, "workgroupBarrier();");
        for i in 0..quads {
            for partner in 1..self.lanes {
                let _ = writeln!(code, "{} += exchange[(lid ^ {partner}u) * {quads}u + {i}u];", var(i));
            }
        }
        let _ = writeln!(code, "workgroupBarrier();");
    }

    /// `vis{r}_{k}`: which of the quad's rows row r sees, `index` giving the quad's positions (`#`: its first
    /// chunk row) to test against `range{r}`.
    fn visible(&self, code: &mut String, index: &str) {
        for r in 0..self.rows {
            for k in 0..self.chunk / 4 {
                let at = index.replace('#', &format!("{}u", 4 * k));
                let _ = writeln!(
                    code,
                    "let vis{r}_{k} = ({at} >= vec4<u32>(range{r}.x)) & ({at} < vec4<u32>(range{r}.y));"
                );
            }
        }
    }

    /// `{acc}{r}_{x} += {coef}{r}_{⌊j/4⌋}[j mod 4] · {tile}[j0 + j]` over the chunk's rows j, for each (acc, coef,
    /// tile): each tile vec4 read once for all the group's rows.
    fn accumulate(&self, code: &mut String, terms: &[(&str, &str, &str)]) {
        for j in 0..self.chunk {
            for x in 0..self.per_lane() {
                let at = self.at(&format!("(j0 + {j}u) * V"), x);
                for &(acc, coef, tile) in terms {
                    let _ = write!(code, "{{ let w = vec4<f32>({tile}[{at}]);");
                    for r in 0..self.rows {
                        let e = ["x", "y", "z", "w"][j as usize % 4];
                        let _ = write!(code, " {acc}{r}_{x} += {coef}{r}_{}.{e} * w;", j / 4);
                    }
                    let _ = writeln!(code, " }}");
                }
            }
        }
    }

    /// `{buffer}[…] = {value}` for the lane's share of each of the group's real rows, and `after` once per row; in
    /// both `@` stands for the row r and `#` for an accumulator's suffix r_x.
    fn store(&self, code: &mut String, buffer: &str, value: &str, after: &str) {
        for r in 0..self.rows {
            let _ = writeln!(code, "if (first + {r}u < rows) {{");
            for x in 0..self.per_lane() {
                let at = self.at(&format!("row{r}.x * V"), x);
                let value = value.replace('#', &format!("{r}_{x}")).replace('@', &r.to_string());
                let _ = writeln!(code, "    {buffer}[{at}] = vec4<Elem>({value});");
            }
            let _ = writeln!(code, "    {}", after.replace('@', &r.to_string()));
            let _ = writeln!(code, "}}");
        }
    }

    /// `row{r}` (its index in [B, Hq, Tq], its position) and `range{r}` (the keys it sees, `within_keys`: of the
    /// workgroup's `keys`) for each of the group's packed query rows.
    fn query_rows(&self, code: &mut String, within_keys: bool) {
        for r in 0..self.rows {
            let _ = writeln!(code, "let row{r} = packed_row(c, b, kvh, min(first + {r}u, rows - 1u));");
            let range = format!("row_keys(c, b, row{r}.y)");
            let range = match within_keys {
                true => format!("clamp({range}, vec2<u32>(keys.x), vec2<u32>(keys.y))"),
                false => range,
            };
            let _ = writeln!(code, "let range{r} = {range};");
        }
    }

    /// The forward kernel's placeholders: `row_setup` (the group's rows, q scaled, m, ℓ, u, the key range [lo, hi)),
    /// `chunk_code` (score `chunk` keys, rescale once, accumulate) and `row_finish` (o = u / ℓ, lse = m + ln ℓ); with
    /// `split`, the workgroup takes split z of the keys (info word 10 keys each) and writes its partial m, ℓ and u
    /// instead ([rows, splits], word 11 the count).
    pub fn forward(&self, split: bool) -> Vec<(&'static str, String)> {
        let mut setup = String::new();
        // A split sees only its own keys: chunks running past its end must not count the next split's.
        self.query_rows(&mut setup, split);
        for r in 0..self.rows {
            let _ = writeln!(setup, "var m{r} = MASKED; var l{r} = 0.0;");
        }
        self.load(&mut setup, "q", "q", " * c.scale", true);
        self.zero(&mut setup, "u");
        self.union(&mut setup);

        let mut chunk = String::new();
        self.dots(&mut chunk, "s", "q", "k_tile");
        self.visible(&mut chunk, "(jv + vec4<u32>(#))");
        let quads = 0..self.chunk / 4;
        // The online softmax's update (flash_common.wgsl): m' = max(m, max_j s_j), α = e^(m − m'),
        // p = e^(s − m'), ℓ' = α ℓ + Σ p, u' = α u + Σ p v.
        for r in 0..self.rows {
            let raised = quads.clone().fold(format!("m{r}"), |m, k| format!("raised_max({m}, s{r}_{k}, vis{r}_{k})"));
            let _ = writeln!(chunk, "let mx{r} = {raised}; let alpha{r} = exp(m{r} - mx{r});");
            for k in quads.clone() {
                let _ = writeln!(chunk, "let p{r}_{k} = weights(s{r}_{k}, vec4<f32>(mx{r}), vis{r}_{k});");
            }
            let sum = quads.clone().map(|k| format!("p{r}_{k}")).collect::<Vec<_>>().join(" + ");
            let _ = writeln!(chunk, "l{r} = rescaled_sum(l{r}, alpha{r}, {sum}); m{r} = mx{r};");
            for x in 0..self.per_lane() {
                let _ = writeln!(chunk, "u{r}_{x} *= alpha{r};");
            }
        }
        self.accumulate(&mut chunk, &[("u", "p", "v_tile")]);

        let mut finish = String::new();
        let outputs = if split {
            for r in 0..self.rows {
                let _ = writeln!(finish, "if (first + {r}u < rows) {{");
                let _ = writeln!(finish, "    let part = row{r}.x * info[11] + wg.z;");
                for x in 0..self.per_lane() {
                    let _ = writeln!(finish, "    part_u[{}] = u{r}_{x};", self.at("part * V", x));
                }
                let _ = writeln!(finish, "    if (lane == 0u) {{ part_m[part] = m{r}; part_l[part] = l{r}; }}");
                let _ = writeln!(finish, "}}");
            }
            SPLIT_OUTPUTS
        } else {
            let lse = "if (lane == 0u) { lse[row@.x] = log_sum_exp(m@, l@); }";
            self.store(&mut finish, "o", "normalized(u#, l@)", lse);
            OUTPUTS
        };
        // Split z's keys: [z · split, (z + 1) · split) within the block's.
        let split_keys = if split {
            "let s0 = max(block_keys.x, wg.z * info[10]); \
             block_keys = vec2<u32>(s0, max(s0, min(block_keys.y, (wg.z + 1u) * info[10])));"
        } else {
            ""
        };
        let mut values = self.values();
        values.extend([("row_setup", setup), ("chunk_code", chunk), ("row_finish", finish)]);
        values.extend([("bindings", outputs.to_string()), ("split_keys", split_keys.to_string())]);
        values
    }

    /// dq's placeholders: p = exp(s − lse) and dp = dO · v recomputed per chunk of keys, ds = p (dp − D),
    /// dq = scale · Σ ds k.
    pub fn dq(&self) -> Vec<(&'static str, String)> {
        let mut setup = String::new();
        self.query_rows(&mut setup, false);
        self.load(&mut setup, "q", "q", " * c.scale", true);
        self.load(&mut setup, "g", "d_o", "", false);
        self.zero(&mut setup, "a");
        for r in 0..self.rows {
            let _ = writeln!(setup, "let lse{r} = lse[row{r}.x]; let dl{r} = delta[row{r}.x];");
        }
        self.union(&mut setup);

        let mut chunk = String::new();
        self.dots(&mut chunk, "s", "q", "k_tile");
        self.dots(&mut chunk, "dp", "g", "v_tile");
        self.visible(&mut chunk, "(jv + vec4<u32>(#))");
        for r in 0..self.rows {
            for k in 0..self.chunk / 4 {
                let p = format!("weights(s{r}_{k}, vec4<f32>(lse{r}), vis{r}_{k})");
                let _ = writeln!(chunk, "let ds{r}_{k} = score_grad({p}, dp{r}_{k}, vec4<f32>(dl{r}));");
            }
        }
        self.accumulate(&mut chunk, &[("a", "ds", "k_tile")]);

        let mut finish = String::new();
        self.store(&mut finish, "dq", "a# * c.scale", "");
        let mut values = self.values();
        values.extend([("row_setup", setup), ("chunk_code", chunk), ("row_finish", finish)]);
        values.extend([("bindings", DQ_BINDINGS.to_string()), ("split_keys", String::new())]);
        values
    }

    /// dk/dv's placeholders, a group per key row j over the packed query rows that see it: p = exp(s − lse),
    /// dv = Σ p dO, ds = p (dO · v − D), dk = scale · Σ ds q. Folded (`Geometry::keys`), dq too: each chunk's ds of
    /// the block's key rows in workgroup memory, then dq_n += scale · Σ_j ds_nj k_j with one f32 atomic add per
    /// element of the chunk's rows.
    pub fn dkdv(&self) -> Vec<(&'static str, String)> {
        const INFO: &str = "@group(0) @binding(8) var<storage, read_write> info: array<u32>;";
        const DQ_INFO: &str = "\
@group(0) @binding(8) var<storage, read_write> dq: array<atomic<f32>>;  // [B, Hq, Tq, D], zeroed before the launch
@group(0) @binding(9) var<storage, read_write> info: array<u32>;";
        // The block's row of each of the group's key rows.
        let local = |r: u32| format!("lid / LANES * ROWS + {r}u");
        let mut setup = String::new();
        for r in 0..self.rows {
            let _ = writeln!(setup, "let key{r} = min(first + {r}u, rows - 1u);");
            let _ = writeln!(setup, "let row{r} = vec2<u32>(kv + key{r}, 0u);");
            let _ = writeln!(setup, "let range{r} = key_queries(c, b, key{r}) * g;");
        }
        self.load(&mut setup, "k", "k", " * c.scale", true);
        if self.fold == Some(KRows::Shared) {
            for r in 0..self.rows {
                for x in 0..self.per_lane() {
                    let _ = writeln!(setup, "k_block[{}] = k{r}_{x};", self.at(&format!("({}) * V", local(r)), x));
                }
            }
        }
        self.load(&mut setup, "v", "v", "", true);
        self.zero(&mut setup, "dk");
        self.zero(&mut setup, "dv");
        self.union(&mut setup);

        let mut chunk = String::new();
        self.dots(&mut chunk, "s", "k", "q_tile");
        self.dots(&mut chunk, "dp", "v", "do_tile");
        self.visible(&mut chunk, "(jv + vec4<u32>(#))");
        for k in 0..self.chunk / 4 {
            let _ = writeln!(chunk, "let ls{k} = lse_tile[j0 / 4u + {k}u]; let dl{k} = delta_tile[j0 / 4u + {k}u];");
            for r in 0..self.rows {
                let p = format!("weights(s{r}_{k}, ls{k}, vis{r}_{k})");
                let _ = writeln!(chunk, "let p{r}_{k} = {p}; let ds{r}_{k} = score_grad(p{r}_{k}, dp{r}_{k}, dl{k});");
            }
        }
        self.accumulate(&mut chunk, &[("dv", "p", "do_tile"), ("dk", "ds", "q_tile")]);

        let mut finish = String::new();
        self.store(&mut finish, "dk", "dk# * c.scale", "");
        self.store(&mut finish, "dv", "dv#", "");
        let mut values = self.values();
        values.extend([("row_setup", setup), ("row_finish", finish)]);
        let Some(k_rows) = self.fold else {
            values.extend([("chunk_code", chunk), ("outputs", INFO.into())]);
            values.extend(["fold_memory", "chunk_skip", "chunk_end"].map(|name| (name, String::new())));
            return values;
        };

        // ds_tile: the chunk's ds_nj, [CHUNK][BLOCK] (zero past the last key, or where a group skips the chunk);
        // k_block: the block's k · scale.
        let mut memory = format!("var<workgroup> ds_tile: array<vec4<f32>, {}>;\n", self.chunk * self.block() / 4);
        if k_rows == KRows::Shared {
            let _ = writeln!(memory, "var<workgroup> k_block: array<vec4<f32>, {}>;", self.block() * self.vec4s);
        }
        let (mut store, mut skip) = (String::from("if (lane == 0u) {\n"), String::from("else if (lane == 0u) {\n"));
        for r in 0..self.rows {
            let _ = writeln!(store, "    let kb{r} = {};", local(r));
            let _ = writeln!(skip, "    let kb{r} = {};", local(r));
            for k in 0..self.chunk / 4 {
                let _ = writeln!(store, "    let m{r}_{k} = select(vec4<f32>(0.0), ds{r}_{k}, first + {r}u < rows);");
                for (e, field) in ["x", "y", "z", "w"].iter().enumerate() {
                    let at = format!("ds_tile[{}u * (BLOCK / 4u) + kb{r} / 4u][kb{r} % 4u]", 4 * k + e as u32);
                    let _ = writeln!(store, "    {at} = m{r}_{k}.{field};");
                    let _ = writeln!(skip, "    {at} = 0.0;");
                }
            }
        }
        chunk.push_str(&store);
        chunk.push_str("}\n");
        skip.push('}');

        // dq_n += scale · Σ_j ds_nj k_j, unrolled (llvmpipe counts every loop iteration of an invocation against one
        // 65,535 budget): invocation λ sums the (row, vec4) slots λ + s · THREADS of the chunk's CHUNK × V, reading
        // ds for four key rows at once; where THREADS is a multiple of V its slots share a vec4 column, and each k
        // vec4 is read once for all of them.
        let slots = (self.chunk * self.vec4s).div_ceil(self.threads);
        let shared_column = self.threads.is_multiple_of(self.vec4s);
        let key = |j: u32, s: u32| match k_rows {
            KRows::Shared => format!("k_block[{j}u * V + qx{s}]"),
            KRows::Buffer => format!("vec4<f32>(vec4<Shared>(k[(kv + min(n0 + {j}u, rows - 1u)) * V + qx{s}]))"),
        };
        let mut end = String::from("workgroupBarrier();\n{\n");
        for s in 0..slots {
            let slot = format!("lid + {}u", s * self.threads);
            let _ = writeln!(end, "let qi{s} = ({slot}) / V; let qx{s} = ({slot}) % V;");
            let _ = writeln!(end, "let at{s} = min(qi{s}, CHUNK - 1u) * (BLOCK / 4u); var part{s} = vec4<f32>(0.0);");
        }
        for m in 0..self.block() / 4 {
            end.push('{');
            if shared_column {
                for e in 0..4 {
                    let _ = write!(end, " let k{e} = {};", key(4 * m + e, 0));
                }
            }
            for s in 0..slots {
                let _ = write!(end, " let w{s} = ds_tile[at{s} + {m}u];");
                let terms = (0..4).map(|e| {
                    let k = if shared_column { format!("k{e}") } else { key(4 * m + e, s) };
                    format!("w{s}.{} * {k}", ["x", "y", "z", "w"][e as usize])
                });
                let _ = write!(end, " part{s} += {};", terms.collect::<Vec<_>>().join(" + "));
            }
            end.push_str(" }\n");
        }
        let scaled = if k_rows == KRows::Shared { "" } else { " * c.scale" };
        for s in 0..slots {
            let _ = writeln!(end, "if (qi{s} < CHUNK && j0 + qi{s} < n && any(part{s} != vec4<f32>(0.0))) {{");
            let _ = writeln!(end, "    let add = part{s}{scaled};");
            let _ = writeln!(end, "    let at = (packed_row(c, b, kvh, t0 + j0 + qi{s}).x * V + qx{s}) * 4u;");
            let _ = writeln!(end, "    atomicAdd(&dq[at], add.x); atomicAdd(&dq[at + 1u], add.y);");
            let _ = writeln!(end, "    atomicAdd(&dq[at + 2u], add.z); atomicAdd(&dq[at + 3u], add.w);");
            let _ = writeln!(end, "}}");
        }
        end.push_str("}\nworkgroupBarrier();");
        values.extend([("chunk_code", chunk), ("outputs", DQ_INFO.into()), ("fold_memory", memory)]);
        values.extend([("chunk_skip", skip), ("chunk_end", end)]);
        values
    }
}

/// Σ terms as a balanced tree of additions: independent partial sums instead of one chain of dependent adds.
fn pairwise(terms: Vec<String>) -> String {
    if terms.len() <= 1 {
        return terms.concat();
    }
    let mut terms = terms;
    let right = terms.split_off(terms.len() / 2);
    format!("({} + {})", pairwise(terms), pairwise(right))
}
