//! Writing results, and the statistics every experiment's tables use.

use anyhow::{Context, Result};
use std::path::Path;

/// Writes `text` to `out/name` (creating `out`) and says so on stderr.
pub fn write(out: &Path, name: &str, text: &str) -> Result<()> {
    std::fs::create_dir_all(out).with_context(|| format!("create {}", out.display()))?;
    let p = out.join(name);
    std::fs::write(&p, text).with_context(|| format!("write {}", p.display()))?;
    eprintln!("wrote {}", p.display());
    Ok(())
}

pub fn median(xs: &[f64]) -> f64 {
    let mut v = xs.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// (min, max).
pub fn range(xs: &[f64]) -> (f64, f64) {
    let lo = xs.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = xs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    (lo, hi)
}

/// Jain's fairness index (1.0 = equal).
pub fn jain(xs: &[f64]) -> f64 {
    let s: f64 = xs.iter().sum();
    let q: f64 = xs.iter().map(|x| x * x).sum();
    if q == 0.0 {
        return 0.0;
    }
    s * s / (xs.len() as f64 * q)
}

/// `n / d`, 0 when `d` is 0.
pub fn per(n: u64, d: u64) -> f64 {
    if d == 0 {
        0.0
    } else {
        n as f64 / d as f64
    }
}

/// `median (min-max)` of `xs` with `decimals` decimals; `-` when empty.
pub fn spread(xs: &[f64], decimals: usize) -> String {
    if xs.is_empty() {
        return "-".into();
    }
    let (lo, hi) = range(xs);
    if xs.len() == 1 {
        return format!("{:.*}", decimals, xs[0]);
    }
    format!(
        "{:.*} ({:.*}-{:.*})",
        decimals,
        median(xs),
        decimals,
        lo,
        decimals,
        hi
    )
}

/// Per-repeat ratios `xs[i] / base[i]` (repeats where `base` is 0 are
/// left out), as [`spread`] with three decimals.
pub fn ratio_spread(xs: &[f64], base: &[f64]) -> String {
    let r: Vec<f64> = xs
        .iter()
        .zip(base)
        .filter(|(_, b)| **b != 0.0)
        .map(|(x, b)| x / b)
        .collect();
    if r.is_empty() {
        return "n/a".into();
    }
    spread(&r, 3)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statistics() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert!(median(&[]).is_nan());
        assert_eq!(range(&[2.0, -1.0, 5.0]), (-1.0, 5.0));
        assert!((jain(&[1.0, 1.0]) - 1.0).abs() < 1e-12);
        assert!((jain(&[1.0, 0.0]) - 0.5).abs() < 1e-12);
        assert_eq!(jain(&[0.0, 0.0]), 0.0);
        assert_eq!(per(3, 0), 0.0);
        assert_eq!(spread(&[3.0, 1.0, 2.0], 1), "2.0 (1.0-3.0)");
        assert_eq!(spread(&[7.0], 0), "7");
        assert_eq!(spread(&[], 0), "-");
        assert_eq!(
            ratio_spread(&[2.0, 3.0, 4.0], &[1.0, 0.0, 2.0]),
            "2.000 (2.000-2.000)"
        );
        assert_eq!(ratio_spread(&[1.0], &[0.0]), "n/a");
    }
}
