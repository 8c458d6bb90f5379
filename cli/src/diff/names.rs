//! Per-name rows of a group: what its steps ran before and after, per step, matched by name.
//!
//! Names are matched exactly first. Then, unless `--exact-names`, the names left on one side
//! only are matched by their *normalized* form ([`normalize`]): template arguments and
//! argument lists removed, and generated suffixes (numeric indices like Inductor's
//! `triton_poi_fused_add_0`, long hexadecimal hashes) dropped. A kernel recompiled with other
//! template arguments or another generated index then reads as one changed row, not as one
//! removed and one added. Names that have an exact match are never merged this way.

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;
use stepscope_format::trace::NameCategory;

/// A name's count and time per step of a group.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct PerStep {
    /// Launches or calls per step.
    pub count: f64,
    /// Device time (kernels) or self time (CPU operators, annotations) per step, µs.
    pub us: f64,
}

/// How a row's name relates the two sides.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// The same name on both sides.
    Same,
    /// Only after.
    Added,
    /// Only before.
    Removed,
    /// Names that differ, matched by their normalized form.
    Matched,
}

impl Status {
    /// For tables: empty for `Same`.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Same => "",
            Status::Added => "added",
            Status::Removed => "removed",
            Status::Matched => "matched",
        }
    }
}

/// One name (or one normalized name's variants) of a group.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NameRow {
    /// The name (after's, when it differs).
    pub name: String,
    /// Kernel, CPU operator or annotation.
    pub category: NameCategory,
    /// How the name matched.
    pub status: Status,
    /// Per step before (`None`: not run).
    pub before: Option<PerStep>,
    /// Per step after.
    pub after: Option<PerStep>,
    /// After's time per step less before's, µs: the name's part of the step's change.
    pub delta_us: f64,
    /// With `matched`: the names on each side.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub before_names: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub after_names: Vec<String>,
}

/// A name and what it is.
pub type Key = (NameCategory, String);

/// Calls and time (µs) summed over a group's steps.
pub type Total = (u64, f64);

/// A side's totals per name over a group's steps.
pub type Totals = HashMap<Key, Total>;

/// The name with template arguments, argument lists, a leading `void ` and generated suffixes
/// removed (see the module docs).
pub fn normalize(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut depth = 0usize;
    for c in name.chars() {
        match c {
            '<' | '(' => depth += 1,
            '>' | ')' => depth = depth.saturating_sub(1),
            c if depth == 0 => out.push(c),
            _ => {}
        }
    }
    let out = out.trim();
    let out = out.strip_prefix("void ").unwrap_or(out).trim();
    let kept: Vec<&str> = out.split('_').filter(|part| !is_generated(part)).collect();
    kept.join("_")
}

/// A numeric index, or a hexadecimal hash of 8 digits or more.
fn is_generated(part: &str) -> bool {
    !part.is_empty()
        && (part.bytes().all(|b| b.is_ascii_digit())
            || (part.len() >= 8
                && part.bytes().all(|b| b.is_ascii_hexdigit())
                && part.bytes().any(|b| b.is_ascii_digit())))
}

fn per_step(total: Total, steps: usize) -> PerStep {
    let n = steps.max(1) as f64;
    PerStep {
        count: total.0 as f64 / n,
        us: total.1 / n,
    }
}

/// The rows of a group from each side's totals over its `n_before` and `n_after` steps, the
/// largest changes first.
pub fn rows(
    before: &Totals,
    n_before: usize,
    after: &Totals,
    n_after: usize,
    normalized: bool,
) -> Vec<NameRow> {
    let mut out = Vec::new();
    let mut only_before: Vec<(&Key, &Total)> = Vec::new();
    for (key, total) in before {
        match after.get(key) {
            Some(a) => {
                let (b, a) = (per_step(*total, n_before), per_step(*a, n_after));
                out.push(NameRow {
                    name: key.1.clone(),
                    category: key.0,
                    status: Status::Same,
                    before: Some(b),
                    after: Some(a),
                    delta_us: a.us - b.us,
                    before_names: Vec::new(),
                    after_names: Vec::new(),
                });
            }
            None => only_before.push((key, total)),
        }
    }
    let only_after: Vec<_> = after
        .iter()
        .filter(|(k, _)| !before.contains_key(*k))
        .collect();
    // By normalized name: (names, summed totals) per side.
    type Side<'a> = (Vec<&'a str>, Total);
    let mut by_key: BTreeMap<Key, (Side, Side)> = BTreeMap::new();
    let key_of = |k: &Key| {
        (
            k.0,
            if normalized {
                normalize(&k.1)
            } else {
                k.1.clone()
            },
        )
    };
    for ((k, t), after_side) in only_before
        .iter()
        .map(|x| (x, false))
        .chain(only_after.iter().map(|x| (x, true)))
    {
        let entry = by_key.entry(key_of(k)).or_default();
        let side = if after_side {
            &mut entry.1
        } else {
            &mut entry.0
        };
        side.0.push(&k.1);
        side.1 .0 += t.0;
        side.1 .1 += t.1;
    }
    for ((category, _), ((mut b_names, b_total), (mut a_names, a_total))) in by_key {
        b_names.sort_unstable();
        a_names.sort_unstable();
        let before = (!b_names.is_empty()).then(|| per_step(b_total, n_before));
        let after = (!a_names.is_empty()).then(|| per_step(a_total, n_after));
        let status = match (&before, &after) {
            (Some(_), Some(_)) => Status::Matched,
            (Some(_), None) => Status::Removed,
            _ => Status::Added,
        };
        let name = a_names.first().or(b_names.first()).copied().unwrap_or("");
        let many = b_names.len() + a_names.len() > 1 || status == Status::Matched;
        out.push(NameRow {
            name: name.to_string(),
            category,
            status,
            delta_us: after.map_or(0.0, |a| a.us) - before.map_or(0.0, |b| b.us),
            before,
            after,
            before_names: if many { strings(&b_names) } else { Vec::new() },
            after_names: if many { strings(&a_names) } else { Vec::new() },
        });
    }
    out.sort_by(|a, b| {
        b.delta_us
            .abs()
            .total_cmp(&a.delta_us.abs())
            .then_with(|| a.name.cmp(&b.name))
    });
    out
}

fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_and_templated_parts_are_normalized_away() {
        assert_eq!(
            normalize("triton_poi_fused_add_mul_0"),
            "triton_poi_fused_add_mul"
        );
        assert_eq!(
            normalize("void at::native::vectorized_elementwise_kernel<4, at::native::AddFunctor<float>>(int, float*)"),
            "at::native::vectorized_elementwise_kernel"
        );
        assert_eq!(normalize("fmha_kernel_deadbeef12"), "fmha_kernel");
        // Shapes written into the name are not generated suffixes.
        assert_eq!(
            normalize("sm80_xmma_gemm_f16f16_tilesize128x128x32_stage3"),
            "sm80_xmma_gemm_f16f16_tilesize128x128x32_stage3"
        );
    }

    #[test]
    fn exact_names_win_and_the_rest_match_by_normalized_name() {
        let k = |n: &str| (NameCategory::Kernel, n.to_string());
        let before: Totals = [
            (k("gemm"), (10, 100.0)),
            (k("triton_poi_fused_add_0"), (10, 50.0)),
            (k("old_only"), (10, 5.0)),
        ]
        .into();
        let after: Totals = [
            (k("gemm"), (10, 100.0)),
            (k("triton_poi_fused_add_3"), (10, 80.0)),
            (k("new_only"), (20, 40.0)),
        ]
        .into();
        let rows = rows(&before, 10, &after, 10, true);
        let by: HashMap<&str, &NameRow> = rows.iter().map(|r| (r.name.as_str(), r)).collect();
        assert_eq!(rows[0].name, "new_only");
        assert_eq!((rows[0].status, rows[0].delta_us), (Status::Added, 4.0));
        let m = by["triton_poi_fused_add_3"];
        assert_eq!((m.status, m.delta_us), (Status::Matched, 3.0));
        assert_eq!(m.before_names, ["triton_poi_fused_add_0"]);
        assert_eq!(by["gemm"].status, Status::Same);
        assert_eq!(by["old_only"].status, Status::Removed);
        let exact = super::rows(&before, 10, &after, 10, false);
        assert_eq!(exact.len(), 5);
    }
}
