//! eˣ and erf(x) for the CPU kernels' inner loops: branch-free polynomials that the compiler vectorises (the C
//! library's expf and erff are called one value at a time). Both are within a few ulp of the C library's (tested).

/// eˣ: x = n ln 2 + r with |r| ≤ ½ ln 2, eʳ by Cephes' degree-7 polynomial, 2ⁿ by the exponent bits; 0 below
/// ln(f32::MIN_POSITIVE), ∞ above ln(f32::MAX), NaN stays NaN.
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    // ln 2 split in two so that n · LN2_HI is exact.
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    // Adding and subtracting 1.5 · 2²³ rounds to the nearest integer.
    const ROUND: f32 = 12_582_912.0;
    let c = x.clamp(-87.336_55, 88.722_83);
    // t = 1.5·2²³ + n: the integer n sits in t's low mantissa bits.
    let t = c * LOG2E + ROUND;
    let n = t - ROUND;
    let r = c - n * LN2_HI - n * LN2_LO;
    let p = 1.987_569_1e-4;
    let p = p * r + 1.398_199_9e-3;
    let p = p * r + 8.333_452e-3;
    let p = p * r + 4.166_579_6e-2;
    let p = p * r + 1.666_666_5e-1;
    let p = p * r + 0.5;
    let er = p * r * r + r + 1.0;
    // 2ⁿ as two factors, each a normal float for every n the clamp allows; integer steps only, so it vectorises.
    let n = (t.to_bits() as i32).wrapping_sub(ROUND.to_bits() as i32);
    let pow2 = |k: i32| f32::from_bits((k.wrapping_add(127) as u32) << 23);
    let half = n >> 1;
    let y = er * pow2(half) * pow2(n.wrapping_sub(half));
    let y = if x < -87.336_55 { 0.0 } else { y };
    let y = if x > 88.722_83 { f32::INFINITY } else { y };
    if x.is_nan() { x } else { y }
}

/// erf(x) as the rational function x P(x²) / Q(x²) on [−4, 4] (±1 to f32 precision outside), the coefficients of
/// Eigen's and XLA's single-precision erf.
#[inline(always)]
pub fn erf(x: f32) -> f32 {
    let x = x.clamp(-4.0, 4.0);
    let x2 = x * x;
    let p = -2.726_142_3e-10;
    let p = p * x2 + 2.770_681_4e-8;
    let p = p * x2 + -2.101_024e-6;
    let p = p * x2 + -5.692_506_4e-5;
    let p = p * x2 + -7.349_906_3e-4;
    let p = p * x2 + -2.954_6e-3;
    let p = p * x2 + -1.609_603_3e-2;
    let q = -1.456_607_2e-5;
    let q = q * x2 + -2.133_740_6e-4;
    let q = q * x2 + -1.682_827e-3;
    let q = q * x2 + -7.373_329e-3;
    let q = q * x2 + -1.426_474e-2;
    x * p / q
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Values from −100 to 100 in steps of 1/1024, plus the edges.
    fn grid() -> impl Iterator<Item = f32> {
        (-102_400..=102_400).map(|i| i as f32 / 1024.0).chain([0.0, -0.0, 1e-30, -1e-30, 88.7, -87.3])
    }

    #[test]
    fn exp_is_within_a_few_ulp_of_the_c_library() {
        for x in grid() {
            let (got, want) = (exp(x), x.exp());
            let tolerance = 4.0 * f32::EPSILON * want + f32::MIN_POSITIVE;
            assert!(got == want || (got - want).abs() <= tolerance, "exp({x}) = {got}, the C library {want}");
        }
        assert_eq!(exp(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp(-1000.0), 0.0);
        assert_eq!(exp(f32::INFINITY), f32::INFINITY);
        assert_eq!(exp(1000.0), f32::INFINITY);
        assert!(exp(f32::NAN).is_nan());
    }

    #[test]
    fn erf_is_within_a_few_ulp_of_the_c_library() {
        for x in grid() {
            let (got, want) = (erf(x), libm::erff(x));
            assert!((got - want).abs() <= 4.0 * f32::EPSILON * want.abs().max(1e-30), "erf({x}) = {got}, libm {want}");
        }
    }
}
