//! The x86 instruction-set level Ember's own CPU kernels run at: the best the CPU has, found once at run time, or a
//! lower one named by `EMBER_CPU_LEVEL` (`portable`, `avx2`, `avx512`; as PyTorch's `ATEN_CPU_CAPABILITY`), so one
//! machine can run, time and test every level. gemm's matrix products choose their own kernels by the CPU alone.

use std::fmt;
use std::sync::OnceLock;

/// An instruction-set level, lowest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum CpuLevel {
    /// The x86-64 baseline (SSE2), or another architecture: the loops as the compiler builds them.
    Portable,
    /// AVX2, FMA and F16C: eight f32 lanes.
    Avx2,
    /// AVX-512 F, BW, DQ and VL beside AVX2: sixteen f32 lanes (and VNNI's 8-bit dot products where the CPU has it).
    Avx512,
}

/// The variable that lowers the level.
pub const LEVEL_VARIABLE: &str = "EMBER_CPU_LEVEL";

impl CpuLevel {
    const ALL: [CpuLevel; 3] = [CpuLevel::Portable, CpuLevel::Avx2, CpuLevel::Avx512];

    /// The name `EMBER_CPU_LEVEL` takes.
    pub fn name(self) -> &'static str {
        match self {
            CpuLevel::Portable => "portable",
            CpuLevel::Avx2 => "avx2",
            CpuLevel::Avx512 => "avx512",
        }
    }

    /// The best level this CPU has.
    pub fn detected() -> CpuLevel {
        #[cfg(target_arch = "x86_64")]
        {
            use std::is_x86_feature_detected as has;
            if has!("avx2") && has!("fma") && has!("f16c") {
                let avx512 = has!("avx512f") && has!("avx512bw") && has!("avx512dq") && has!("avx512vl");
                return if avx512 { CpuLevel::Avx512 } else { CpuLevel::Avx2 };
            }
        }
        CpuLevel::Portable
    }

    /// The level `EMBER_CPU_LEVEL` asks for (None when it is unset), or an error naming the values it takes.
    pub fn requested() -> Result<Option<CpuLevel>, String> {
        let Some(value) = std::env::var_os(LEVEL_VARIABLE) else { return Ok(None) };
        let value = value.to_string_lossy();
        Self::ALL.into_iter().find(|l| l.name() == value).map(Some).ok_or_else(|| {
            let names: Vec<_> = Self::ALL.iter().map(|l| l.name()).collect();
            format!("{LEVEL_VARIABLE}={value:?}: the CPU kernel level is one of {}", names.join(", "))
        })
    }
}

impl fmt::Display for CpuLevel {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The level the kernels run at (decided once): the lower of the detected level and the requested one (an
/// unreadable request is ignored here; the `ember` binary refuses it at start).
pub fn cpu_level() -> CpuLevel {
    static LEVEL: OnceLock<CpuLevel> = OnceLock::new();
    *LEVEL.get_or_init(|| {
        let detected = CpuLevel::detected();
        CpuLevel::requested().ok().flatten().map_or(detected, |asked| asked.min(detected))
    })
}

/// Whether the kernels run with AVX-512 VNNI's 8-bit dot products (on 256-bit vectors): the AVX-512 level on a CPU
/// that has them.
pub fn has_vnni() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        static HAS: OnceLock<bool> = OnceLock::new();
        *HAS.get_or_init(|| cpu_level() >= CpuLevel::Avx512 && std::is_x86_feature_detected!("avx512vnni"))
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// The kernels' level in one line, with gemm's (which follows the CPU, not `EMBER_CPU_LEVEL`), for benchmark headers.
pub fn describe() -> String {
    let vnni = if has_vnni() { " + VNNI" } else { "" };
    format!("CPU kernels {}{vnni}, matrix products gemm {}", cpu_level(), CpuLevel::detected())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_level_run_is_never_above_the_cpu_nor_the_request() {
        assert!(cpu_level() <= CpuLevel::detected());
        if let Ok(Some(asked)) = CpuLevel::requested() {
            assert!(cpu_level() <= asked);
        }
    }
}
