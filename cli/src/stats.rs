//! The statistics `analyze` and `ctl` share: medians, nearest-rank percentiles, and which
//! workers or ranks are stragglers.

/// The stragglers' rule: a value at least this many times the median of all of them.
pub const STRAGGLER_FACTOR: f64 = 1.2;

/// The median (the mean of the two middle values for an even count).
pub fn median(mut v: Vec<f64>) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

/// The nearest-rank percentile of sorted values.
pub fn percentile(sorted: &[f64], p: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

/// Which of `values` (each worker's or rank's typical step time; `None`: unknown) are
/// stragglers: at least [`STRAGGLER_FACTOR`] times the median of the known ones, judged only
/// among two or more.
pub fn stragglers(values: &[Option<f64>]) -> Vec<bool> {
    let known: Vec<f64> = values.iter().flatten().copied().collect();
    let median = if known.len() >= 2 {
        median(known)
    } else {
        None
    };
    values
        .iter()
        .map(|v| match (v, median) {
            (Some(v), Some(m)) => m > 0.0 && *v >= STRAGGLER_FACTOR * m,
            _ => false,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), Some(50.0));
        assert_eq!(percentile(&v, 99.0), Some(99.0));
        assert_eq!(percentile(&[7.0], 99.0), Some(7.0));
        assert_eq!(percentile(&[], 50.0), None);
    }

    #[test]
    fn a_straggler_is_judged_among_two_or_more() {
        assert_eq!(
            stragglers(&[Some(5.0), Some(5.0), Some(9.0)]),
            [false, false, true]
        );
        assert_eq!(stragglers(&[Some(50.0), None]), [false, false]);
        assert_eq!(median(vec![1.0, 3.0, 2.0, 4.0]), Some(2.5));
    }
}
