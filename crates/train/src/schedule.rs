//! Learning-rate schedules, as a function of the optimizer step s (0-based).

use crate::config::{ScheduleKind, TaskKind, TrainConfig};

/// The learning rate for step `s` of a `task` run configured by `train`, for a model of width `d_model`.
pub fn learning_rate(train: &TrainConfig, task: TaskKind, d_model: usize, s: u64) -> f64 {
    let w = train.warmup_steps;
    match train.schedule(task) {
        ScheduleKind::Cosine => cosine(train.lr, train.min_lr, w, train.decay_steps(), s),
        ScheduleKind::Noam => train.lr * noam(d_model, w, s + 1),
        ScheduleKind::Constant if s < w => train.lr * (s + 1) as f64 / (w + 1) as f64,
        ScheduleKind::Constant => train.lr,
    }
}

/// nanoGPT: lr·(s+1)/(w+1) while s < w; then min_lr + ½(1 + cos(π·(s − w)/(n − w)))·(lr − min_lr); min_lr after n.
pub fn cosine(lr: f64, min_lr: f64, w: u64, n: u64, s: u64) -> f64 {
    if s < w {
        return lr * (s + 1) as f64 / (w + 1) as f64;
    }
    if s >= n {
        return min_lr;
    }
    let ratio = (s - w) as f64 / (n - w) as f64;
    min_lr + 0.5 * (1.0 + (std::f64::consts::PI * ratio).cos()) * (lr - min_lr)
}

/// Vaswani et al. (2017) eq. 3: d^-0.5 · min(s^-0.5, s · w^-1.5), with s counted from 1.
pub fn noam(d_model: usize, w: u64, s: u64) -> f64 {
    let (d, w, s) = (d_model as f64, w as f64, s as f64);
    d.powf(-0.5) * s.powf(-0.5).min(s * w.powf(-1.5))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cosine_warms_up_peaks_and_ends_at_min_lr() {
        assert!((cosine(1e-3, 1e-4, 100, 2000, 0) - 1e-3 / 101.0).abs() < 1e-12);
        assert!((cosine(1e-3, 1e-4, 100, 2000, 100) - 1e-3).abs() < 1e-12);
        assert!((cosine(1e-3, 1e-4, 100, 2000, 1050) - 5.5e-4).abs() < 1e-12); // halfway: the mean
        assert_eq!(cosine(1e-3, 1e-4, 100, 2000, 2000), 1e-4);
        assert_eq!(cosine(1e-3, 1e-4, 100, 2000, 5000), 1e-4);
    }

    #[test]
    fn noam_peaks_at_warmup() {
        let peak = noam(512, 4000, 4000);
        assert!((peak - 512f64.powf(-0.5) * 4000f64.powf(-0.5)).abs() < 1e-15);
        assert!(noam(512, 4000, 3999) < peak && noam(512, 4000, 4001) < peak);
        assert!((noam(512, 4000, 16000) - peak / 2.0).abs() < 1e-12); // s^-0.5 decay
    }
}
