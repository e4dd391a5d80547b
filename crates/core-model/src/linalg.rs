//! Dense linear algebra on the host in f64, for what converts weights rather than runs them: the eigenvectors of a
//! symmetric matrix by cyclic Jacobi rotations (Golub & Van Loan, §8.5), and from them the best rank-L factorisation
//! of a matrix (Eckart–Young: the top right singular vectors are the top eigenvectors of MᵀM). Burn's own SVD
//! (burn-linalg) runs its host fallback only on backends its `flex` feature enables, which Burn builds without.

/// Eigenvalues (descending) and unit eigenvectors (`vectors[i]` belongs to `values[i]`) of the symmetric n×n matrix
/// `a` (row-major): rotations zero each off-diagonal entry in turn until their sum of squares is 1e-24 of the whole.
pub fn symmetric_eigen(mut a: Vec<f64>, n: usize) -> (Vec<f64>, Vec<Vec<f64>>) {
    assert_eq!(a.len(), n * n, "an n×n matrix");
    let mut v = vec![0.0; n * n];
    (0..n).for_each(|i| v[i * n + i] = 1.0);
    let total: f64 = a.iter().map(|x| x * x).sum();
    for _sweep in 0..100 {
        let off: f64 = (0..n * n).filter(|ij| ij / n != ij % n).map(|ij| a[ij] * a[ij]).sum();
        if off <= 1e-24 * total.max(f64::MIN_POSITIVE) {
            break;
        }
        for p in 0..n {
            for q in p + 1..n {
                let apq = a[p * n + q];
                if apq == 0.0 {
                    continue;
                }
                // The rotation (c, s) that zeroes a_pq: tan 2θ = 2a_pq / (a_qq − a_pp).
                let tau = (a[q * n + q] - a[p * n + p]) / (2.0 * apq);
                let t = tau.signum() / (tau.abs() + (1.0 + tau * tau).sqrt());
                let c = 1.0 / (1.0 + t * t).sqrt();
                let s = t * c;
                for k in 0..n {
                    let (akp, akq) = (a[k * n + p], a[k * n + q]);
                    a[k * n + p] = c * akp - s * akq;
                    a[k * n + q] = s * akp + c * akq;
                }
                for k in 0..n {
                    let (apk, aqk) = (a[p * n + k], a[q * n + k]);
                    a[p * n + k] = c * apk - s * aqk;
                    a[q * n + k] = s * apk + c * aqk;
                }
                for k in 0..n {
                    let (vkp, vkq) = (v[k * n + p], v[k * n + q]);
                    v[k * n + p] = c * vkp - s * vkq;
                    v[k * n + q] = s * vkp + c * vkq;
                }
            }
        }
    }
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|&i, &j| a[j * n + j].total_cmp(&a[i * n + i]));
    let values = order.iter().map(|&i| a[i * n + i]).collect();
    let vectors = order.iter().map(|&i| (0..n).map(|k| v[k * n + i]).collect()).collect();
    (values, vectors)
}

/// The best rank-`rank` factorisation M ≈ A B of the rows×cols matrix `m` (row-major) in the Frobenius norm:
/// A [rows × rank], B [rank × cols], both row-major, with B's rows orthonormal when cols ≤ rows (B = V_Lᵀ, A = M V_L)
/// and A's columns orthonormal otherwise (A = U_L, B = U_Lᵀ M). At rank = min(rows, cols) the product is M.
pub fn low_rank(m: &[f64], rows: usize, cols: usize, rank: usize) -> (Vec<f64>, Vec<f64>) {
    assert!(rank <= rows.min(cols), "rank {rank} of a {rows}×{cols} matrix");
    let at = |i: usize, j: usize| m[i * cols + j];
    if cols <= rows {
        let gram: Vec<f64> =
            (0..cols * cols).map(|ij| (0..rows).map(|k| at(k, ij / cols) * at(k, ij % cols)).sum()).collect();
        let (_, vectors) = symmetric_eigen(gram, cols);
        let b: Vec<f64> = vectors[..rank].iter().flatten().copied().collect();
        let a =
            (0..rows * rank).map(|il| (0..cols).map(|j| at(il / rank, j) * b[(il % rank) * cols + j]).sum()).collect();
        (a, b)
    } else {
        let gram: Vec<f64> =
            (0..rows * rows).map(|ij| (0..cols).map(|k| at(ij / rows, k) * at(ij % rows, k)).sum()).collect();
        let (_, vectors) = symmetric_eigen(gram, rows);
        let a = (0..rows * rank).map(|il| vectors[il % rank][il / rank]).collect();
        let b = (0..rank * cols).map(|lj| (0..rows).map(|i| vectors[lj / cols][i] * at(i, lj % cols)).sum()).collect();
        (a, b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ember_formats::Rng;

    fn product(a: &[f64], b: &[f64], rows: usize, inner: usize, cols: usize) -> Vec<f64> {
        (0..rows * cols)
            .map(|ij| (0..inner).map(|k| a[(ij / cols) * inner + k] * b[k * cols + ij % cols]).sum())
            .collect()
    }

    #[test]
    fn eigenvectors_diagonalise_a_symmetric_matrix() {
        let mut rng = Rng::new(4);
        let n = 7;
        let x: Vec<f64> = (0..n * n).map(|_| rng.normal()).collect();
        let a: Vec<f64> = (0..n * n).map(|ij| x[ij] + x[(ij % n) * n + ij / n]).collect();
        let (values, vectors) = symmetric_eigen(a.clone(), n);
        assert!(values.windows(2).all(|w| w[0] >= w[1]), "descending");
        for (value, v) in values.iter().zip(&vectors) {
            let av = product(&a, v, n, n, 1);
            let residual = av.iter().zip(v).map(|(l, r)| (l - value * r).abs()).fold(0.0, f64::max);
            assert!(residual < 1e-10, "A v = λ v: residual {residual} for λ = {value}");
        }
    }

    /// At full rank the factors reproduce M exactly (tall and wide); at lower rank the error is the dropped singular
    /// values' share, less than at the rank below.
    #[test]
    fn full_rank_reproduces_the_matrix_and_lower_ranks_approximate_it() {
        let mut rng = Rng::new(5);
        for (rows, cols) in [(9, 5), (5, 9)] {
            let m: Vec<f64> = (0..rows * cols).map(|_| rng.normal()).collect();
            let error = |rank: usize| {
                let (a, b) = low_rank(&m, rows, cols, rank);
                let p = product(&a, &b, rows, rank, cols);
                p.iter().zip(&m).map(|(x, y)| (x - y).powi(2)).sum::<f64>().sqrt()
            };
            assert!(error(5) < 1e-10, "{rows}×{cols}: {}", error(5));
            assert!(error(4) < error(3) && error(3) < error(1), "{rows}×{cols}");
        }
    }
}
