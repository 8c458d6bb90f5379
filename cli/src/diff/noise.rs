//! Whether two samples of step times differ beyond their noise: the Mann-Whitney rank test,
//! the Hodges-Lehmann shift with its confidence interval, and Holm's correction over groups.
//!
//! What they are applied to: not each step's time but the medians of [`BLOCKS`] blocks of
//! consecutive steps per side ([`block_medians`]). Consecutive steps are not independent (on a
//! busy host a stretch of steps is slow together, and a capture of a second or two can hold
//! more or fewer such stretches than the next one: measured on a live vLLM on 2 cores, two
//! captures of one unchanged workload differed by 22% in their median decode step, and a
//! rank test on single steps called that a change at p = 0.003). Blocks make a stretch count
//! once: the test assumes the blocks, not the steps, are independent draws, and nothing about
//! the distribution's shape (ranks only). With 10 blocks a side the smallest p-value is about
//! 2e-4, enough for Holm's correction over a few dozen groups at 0.01.
//!
//! A run can also drift as a whole: on that host, two captures a minute apart differed by up
//! to 23% in their decode steps' median, and the test reached p = 0.021 and 0.011. No test on one
//! capture a side can tell such drift from a change; what the data does say is how far a run's
//! own stretches wander. [`band`] takes that as the model of run-to-run drift, conservatively:
//! as if each run's level were drawn like one of its blocks, the shift two unchanged runs show
//! stays within `z(alpha) × √(σ_before² + σ_after²)`, each σ estimated from the interquartile
//! range of the side's block medians (IQR / 1.349, as for a normal). A shift inside the band is
//! not called a change. On GPU traces, whose steps repeat to a few percent, the band is narrow
//! and the minimum change decides.

/// The complementary error function, to a relative error below 1.2e-7 (Chebyshev fit,
/// Numerical Recipes' `erfcc`).
fn erfc(x: f64) -> f64 {
    let z = x.abs();
    let t = 1.0 / (1.0 + 0.5 * z);
    let poly = -z * z - 1.265_512_23
        + t * (1.000_023_68
            + t * (0.374_091_96
                + t * (0.096_784_18
                    + t * (-0.186_288_06
                        + t * (0.278_868_07
                            + t * (-1.135_203_98
                                + t * (1.488_515_87 + t * (-0.822_152_23 + t * 0.170_872_77))))))));
    let r = t * poly.exp();
    if x >= 0.0 {
        r
    } else {
        2.0 - r
    }
}

/// P(|Z| ≥ z) for a standard normal Z.
fn two_sided(z: f64) -> f64 {
    erfc(z.abs() / std::f64::consts::SQRT_2).min(1.0)
}

/// The z with P(|Z| ≥ z) = `alpha` (bisection: no closed form needed at this precision).
fn critical(alpha: f64) -> f64 {
    let (mut lo, mut hi) = (0.0f64, 40.0f64);
    for _ in 0..200 {
        let mid = 0.5 * (lo + hi);
        if two_sided(mid) > alpha {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    0.5 * (lo + hi)
}

/// Ranks of the pooled values (ties get their mean rank), and Σ(t³ - t) over tie groups.
fn pooled_ranks(a: &[f64], b: &[f64]) -> (f64, f64) {
    let mut all: Vec<(f64, bool)> = a
        .iter()
        .map(|&x| (x, true))
        .chain(b.iter().map(|&x| (x, false)))
        .collect();
    all.sort_by(|x, y| x.0.total_cmp(&y.0));
    let (mut rank_sum_a, mut ties) = (0.0, 0.0);
    let mut i = 0;
    while i < all.len() {
        let mut j = i + 1;
        while j < all.len() && all[j].0 == all[i].0 {
            j += 1;
        }
        // Ranks i+1 ..= j, shared.
        let mean_rank = (i + 1 + j) as f64 / 2.0;
        let t = (j - i) as f64;
        ties += t * t * t - t;
        rank_sum_a += mean_rank * all[i..j].iter().filter(|v| v.1).count() as f64;
        i = j;
    }
    (rank_sum_a, ties)
}

/// The two-sided p-value of the Mann-Whitney U test of `a` against `b` (normal approximation
/// with tie and continuity corrections). 1 when either side is empty or every value is tied.
pub fn mann_whitney(a: &[f64], b: &[f64]) -> f64 {
    let (n1, n2) = (a.len() as f64, b.len() as f64);
    if a.is_empty() || b.is_empty() {
        return 1.0;
    }
    let (rank_sum_a, ties) = pooled_ranks(a, b);
    let u = rank_sum_a - n1 * (n1 + 1.0) / 2.0;
    let n = n1 + n2;
    let var = n1 * n2 / 12.0 * ((n + 1.0) - ties / (n * (n - 1.0)));
    if var <= 0.0 {
        return 1.0;
    }
    let z = ((u - n1 * n2 / 2.0).abs() - 0.5).max(0.0) / var.sqrt();
    two_sided(z)
}

/// Blocks of consecutive steps per side.
pub const BLOCKS: usize = 10;

/// The medians of `min(BLOCKS, n)` blocks of consecutive values of `v` (in their order), as
/// even in size as the count allows.
pub fn block_medians(v: &[f64]) -> Vec<f64> {
    let k = BLOCKS.min(v.len());
    (0..k)
        .filter_map(|i| {
            let block = &v[i * v.len() / k..(i + 1) * v.len() / k];
            crate::stats::median(block.to_vec())
        })
        .collect()
}

/// The shift two runs with no change between them stay within, at level `alpha`, if each
/// run's level wanders as its blocks do (see the module docs): `z(alpha) × √(σ_a² + σ_b²)`, σ
/// from each side's block medians' interquartile range.
pub fn band(a: &[f64], b: &[f64], alpha: f64) -> f64 {
    let sigma = |v: &[f64]| spread(v) / 1.349;
    critical(alpha) * (sigma(a).powi(2) + sigma(b).powi(2)).sqrt()
}

/// The interquartile range of `v` (nearest-rank quartiles; 0 for fewer than 4 values): how
/// far a run's blocks wander.
pub fn spread(v: &[f64]) -> f64 {
    if v.len() < 4 {
        return 0.0;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let q = |p: f64| crate::stats::percentile(&s, p).unwrap_or(0.0);
    q(75.0) - q(25.0)
}

/// Pairs of values above which [`shift`] thins each side to evenly spaced quantiles.
const MAX_PAIRS: usize = 4_000_000;

/// Evenly spaced order statistics of sorted `v`, at most `n` of them.
fn thinned(v: &[f64], n: usize) -> Vec<f64> {
    if v.len() <= n {
        return v.to_vec();
    }
    (0..n)
        .map(|i| v[(i * (v.len() - 1)) / (n - 1).max(1)])
        .collect()
}

/// The Hodges-Lehmann estimate of how much `b` is shifted from `a` (the median of the
/// differences b_j - a_i over all pairs) and its `1 - alpha` confidence interval (Moses: the
/// order statistics of the differences at the Mann-Whitney critical values). `None` when a
/// side is empty. Above four million pairs, each side is first thinned to evenly spaced
/// quantiles.
pub fn shift(a: &[f64], b: &[f64], alpha: f64) -> Option<(f64, f64, f64)> {
    if a.is_empty() || b.is_empty() {
        return None;
    }
    let mut a = a.to_vec();
    let mut b = b.to_vec();
    a.sort_by(f64::total_cmp);
    b.sort_by(f64::total_cmp);
    if a.len() * b.len() > MAX_PAIRS {
        let side = (MAX_PAIRS as f64).sqrt() as usize;
        a = thinned(&a, side);
        b = thinned(&b, side);
    }
    let mut d: Vec<f64> = Vec::with_capacity(a.len() * b.len());
    for y in &b {
        d.extend(a.iter().map(|x| y - x));
    }
    d.sort_by(f64::total_cmp);
    let nm = d.len();
    let mid = if nm % 2 == 1 {
        d[nm / 2]
    } else {
        (d[nm / 2 - 1] + d[nm / 2]) / 2.0
    };
    let (n, m) = (a.len() as f64, b.len() as f64);
    let k = (n * m / 2.0 - critical(alpha) * (n * m * (n + m + 1.0) / 12.0).sqrt()).floor();
    let k = (k.max(0.0) as usize).min((nm - 1) / 2);
    Some((mid, d[k], d[nm - 1 - k]))
}

/// Holm's step-down correction: which of the p-values are significant at family-wise level
/// `alpha`.
pub fn holm(p: &[f64], alpha: f64) -> Vec<bool> {
    let mut order: Vec<usize> = (0..p.len()).collect();
    order.sort_by(|&x, &y| p[x].total_cmp(&p[y]));
    let mut out = vec![false; p.len()];
    for (i, &at) in order.iter().enumerate() {
        if p[at] <= alpha / (p.len() - i) as f64 {
            out[at] = true;
        } else {
            break;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normal_tails_match_tables() {
        // P(|Z| >= 1.96) = 0.05, P(|Z| >= 2.5758) = 0.01.
        assert!((two_sided(1.959_964) - 0.05).abs() < 1e-6);
        assert!((critical(0.01) - 2.575_829).abs() < 1e-4);
    }

    #[test]
    fn mann_whitney_matches_a_worked_example() {
        // a = 1..=8, b = 5..=12: pooled ranks give a the rank sum 44, so U = 44 - 36 = 8
        // against a mean of 32; four pairs of ties (5-8) make the variance
        // 64/12 * (17 - 24/240) = 90.13; z = (24 - 0.5) / 9.494 = 2.475, p = 0.0133.
        let a: Vec<f64> = (1..=8).map(f64::from).collect();
        let b: Vec<f64> = (5..=12).map(f64::from).collect();
        let p = mann_whitney(&a, &b);
        assert!((p - 0.01332).abs() < 2e-4, "{p}");
        assert_eq!(mann_whitney(&b, &a), p);
        assert_eq!(mann_whitney(&[1.0; 5], &[1.0; 5]), 1.0);
    }

    #[test]
    fn the_shift_of_a_shifted_sample_is_found_with_its_interval() {
        let a: Vec<f64> = (0..50).map(|i| 100.0 + (i * 37 % 11) as f64).collect();
        let b: Vec<f64> = a.iter().map(|x| x + 20.0).collect();
        let (s, lo, hi) = shift(&a, &b, 0.01).unwrap();
        assert_eq!(s, 20.0);
        assert!(lo <= 20.0 && 20.0 <= hi && hi - lo < 6.0, "{lo} {hi}");
    }

    #[test]
    fn the_spread_is_the_interquartile_range() {
        let v: Vec<f64> = (1..=8).map(f64::from).collect();
        assert_eq!(spread(&v), 6.0 - 2.0);
        assert_eq!(spread(&[1.0, 9.0, 5.0]), 0.0);
        // Two sides of IQR 1.349 (σ = 1) each: z(0.01) × √2.
        let side: Vec<f64> = [0.0, 0.0, 1.349, 1.349].to_vec();
        assert!((band(&side, &side, 0.01) - 2.575_83 * 2f64.sqrt()).abs() < 1e-3);
    }

    #[test]
    fn blocks_are_consecutive_and_even() {
        let v: Vec<f64> = (0..25).map(f64::from).collect();
        let m = block_medians(&v);
        assert_eq!(m.len(), BLOCKS);
        // Blocks of 2 or 3: [0, 1], [2, 3, 4], [5, 6], …
        assert_eq!(&m[..3], &[0.5, 3.0, 5.5]);
        assert_eq!(block_medians(&[4.0, 1.0]), [4.0, 1.0]);
    }

    /// Samples of `n` step times around `mean`, with ±`jitter` uniform noise (xorshift).
    fn sample(seed: &mut u64, n: usize, mean: f64, jitter: f64) -> Vec<f64> {
        (0..n)
            .map(|_| {
                *seed ^= *seed << 13;
                *seed ^= *seed >> 7;
                *seed ^= *seed << 17;
                let u = (*seed >> 11) as f64 / (1u64 << 53) as f64;
                mean * (1.0 + jitter * (2.0 * u - 1.0))
            })
            .collect()
    }

    #[test]
    fn on_blocks_the_test_keeps_its_level_and_finds_a_real_shift() {
        // 400 pairs of the same distribution: at alpha 0.01, about 4 should be called
        // significant (more than 12 has probability below 1e-3 for a test that keeps its level).
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        // Of `pairs` pairs of 60 steps around 10 and around `after`, ±30%: how many the test
        // calls significant at 0.01.
        let mut significant = |pairs: usize, after: f64| {
            (0..pairs)
                .filter(|_| {
                    let a = block_medians(&sample(&mut seed, 60, 10.0, 0.3));
                    let b = block_medians(&sample(&mut seed, 60, after, 0.3));
                    mann_whitney(&a, &b) <= 0.01
                })
                .count()
        };
        let false_alarms = significant(400, 10.0);
        assert!(false_alarms <= 12, "{false_alarms} of 400");
        // A 30% shift under ±30% noise, 60 steps a side: found every time.
        assert_eq!(significant(100, 13.0), 100);
    }

    #[test]
    fn a_run_drifting_as_its_blocks_wander_stays_in_the_band() {
        // Steps whose level wanders by stretches: ten stretches of six steps, each stretch's
        // level drawn from ±30%.
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut run = |offset: f64| -> Vec<f64> {
            (0..10)
                .flat_map(|_| {
                    let level = sample(&mut seed, 1, 10.0, 0.3)[0] + offset;
                    sample(&mut seed, 6, level, 0.05)
                })
                .collect()
        };
        let before = block_medians(&run(0.0));
        let iqr = spread(&before);
        // The whole of the after run a stretch's IQR higher: inside the band.
        let drifted = block_medians(&run(iqr));
        let (shift, _, _) = shift(&before, &drifted, 0.01).unwrap();
        assert!(shift.abs() < band(&before, &drifted, 0.01), "{shift} {iqr}");
        // Five IQRs higher: outside it, and the test agrees.
        let slower = block_medians(&run(5.0 * iqr));
        let (shift, _, _) = super::shift(&before, &slower, 0.01).unwrap();
        assert!(shift > band(&before, &slower, 0.01), "{shift} {iqr}");
        assert!(mann_whitney(&before, &slower) <= 0.01);
    }

    #[test]
    fn holm_steps_down() {
        assert_eq!(holm(&[0.001, 0.03, 0.04], 0.05), [true, false, false]);
        assert_eq!(holm(&[0.04, 0.001, 0.02], 0.05), [true, true, true]);
        assert_eq!(holm(&[0.001, 0.02, 0.03], 0.1), [true, true, true]);
    }
}
