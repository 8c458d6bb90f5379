//! `stepscope.Iteration`: one engine iteration's counts and, when the engine gives them, its
//! requests with each one's tokens, phase and computed tokens (the core decides the phase
//! from outputs and sums the work: `requests::in_prefill`, `IterationDetail::of_shares`).

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use stepscope::{IterationDetail, IterationInfo, PhaseSums, RequestShare};

use crate::args::{count, sum};

/// The counts of one engine iteration: context (prefill) and generation (decode) requests and
/// their scheduled tokens. The six optional sums are vLLM's roofline sums for
/// `detailed_trace_annotation` names; give all of a phase's or leave them out.
#[pyclass(module = "stepscope", name = "Iteration", frozen, eq)]
#[derive(Clone, PartialEq)]
pub(crate) struct PyIteration {
    pub(crate) info: IterationInfo,
    /// The ids of the requests the iteration serves (`stepscope.request_ids`).
    pub(crate) request_ids: Option<Vec<String>>,
    /// Each request's tokens and phase, in the order of `request_ids`, when given.
    pub(crate) shares: Vec<RequestShare>,
}

/// Each request's part of the iteration from `request_tokens` and its phase, given as
/// `request_prefill` or decided by the core from `request_outputs` (the tokens each had
/// produced before: `requests::in_prefill`, the one rule), and `request_computed` (with them,
/// or not at all): one per id (per token count when no ids are given), counts not negative.
fn shares_of(
    ids: Option<&Vec<String>>,
    tokens: Option<Vec<i64>>,
    prefill: Option<Vec<bool>>,
    outputs: Option<Vec<i64>>,
    computed: Option<Vec<i64>>,
) -> PyResult<Vec<RequestShare>> {
    let prefill = match (prefill, outputs) {
        (Some(_), Some(_)) => {
            return Err(PyValueError::new_err(
                "request_prefill and request_outputs say the same: give one",
            ))
        }
        (Some(p), None) => Some(p),
        (None, Some(o)) => Some(
            o.into_iter()
                .map(|n| count("request_outputs", n).map(stepscope::requests::in_prefill))
                .collect::<PyResult<Vec<bool>>>()?,
        ),
        (None, None) => None,
    };
    let (tokens, prefill) = match (tokens, prefill) {
        (None, None) => return Ok(Vec::new()),
        (Some(t), Some(p)) => (t, p),
        _ => {
            return Err(PyValueError::new_err(
                "request_tokens and request_prefill (or request_outputs) go together: give \
                 both or neither",
            ))
        }
    };
    let n = ids.map_or(tokens.len(), Vec::len);
    for (name, len) in [
        ("request_tokens", tokens.len()),
        ("request_prefill", prefill.len()),
        ("request_computed", computed.as_ref().map_or(n, Vec::len)),
    ] {
        if len != n {
            return Err(PyValueError::new_err(format!(
                "{name} must have one entry per request ({n}), got {len}"
            )));
        }
    }
    let computed = computed.map(|c| c.into_iter().map(Some).collect::<Vec<_>>());
    let computed = computed.unwrap_or_else(|| vec![None; n]);
    tokens
        .into_iter()
        .zip(prefill)
        .zip(computed)
        .map(|((t, prefill), c)| {
            Ok(RequestShare {
                tokens: count("request_tokens", t)?,
                computed: c.map(|c| count("request_computed", c)).transpose()?,
                prefill,
            })
        })
        .collect()
}

#[pymethods]
impl PyIteration {
    #[new]
    #[pyo3(signature = (
        num_ctx_reqs = 0, num_ctx_tokens = 0, num_gen_reqs = 0, num_gen_tokens = 0, *,
        ctx_seq_len_sum = None, ctx_qq_compute = None, ctx_qk_compute = None,
        gen_seq_len_sum = None, gen_qq_compute = None, gen_qk_compute = None,
        request_ids = None, request_tokens = None, request_prefill = None,
        request_computed = None, request_outputs = None,
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        num_ctx_reqs: i64,
        num_ctx_tokens: i64,
        num_gen_reqs: i64,
        num_gen_tokens: i64,
        ctx_seq_len_sum: Option<i64>,
        ctx_qq_compute: Option<i64>,
        ctx_qk_compute: Option<i64>,
        gen_seq_len_sum: Option<i64>,
        gen_qq_compute: Option<i64>,
        gen_qk_compute: Option<i64>,
        request_ids: Option<Vec<String>>,
        request_tokens: Option<Vec<i64>>,
        request_prefill: Option<Vec<bool>>,
        request_computed: Option<Vec<i64>>,
        request_outputs: Option<Vec<i64>>,
    ) -> PyResult<Self> {
        // Each request's tokens and computed tokens given (even for no request: an iteration
        // that scheduled nothing) make the detailed sums known.
        let computed_given = request_computed.is_some();
        if computed_given && request_tokens.is_none() {
            return Err(PyValueError::new_err(
                "request_computed goes with request_tokens and request_prefill (or \
                 request_outputs)",
            ));
        }
        let shares = shares_of(
            request_ids.as_ref(),
            request_tokens,
            request_prefill,
            request_outputs,
            request_computed,
        )?;
        let mut info = IterationInfo::new(
            count("num_ctx_reqs", num_ctx_reqs)?,
            count("num_ctx_tokens", num_ctx_tokens)?,
            count("num_gen_reqs", num_gen_reqs)?,
            count("num_gen_tokens", num_gen_tokens)?,
        );
        let sums = [
            ctx_seq_len_sum,
            ctx_qq_compute,
            ctx_qk_compute,
            gen_seq_len_sum,
            gen_qq_compute,
            gen_qk_compute,
        ];
        if sums.iter().any(Option::is_some) {
            info = info.with_detail(IterationDetail {
                ctx: PhaseSums {
                    seq_len_sum: sum("ctx_seq_len_sum", ctx_seq_len_sum)?,
                    qq_compute: sum("ctx_qq_compute", ctx_qq_compute)?,
                    qk_compute: sum("ctx_qk_compute", ctx_qk_compute)?,
                },
                gen: PhaseSums {
                    seq_len_sum: sum("gen_seq_len_sum", gen_seq_len_sum)?,
                    qq_compute: sum("gen_qq_compute", gen_qq_compute)?,
                    qk_compute: sum("gen_qk_compute", gen_qk_compute)?,
                },
            });
        } else if let Some(detail) = computed_given
            .then(|| IterationDetail::of_shares(&shares))
            .flatten()
        {
            // The core sums the requests' counts: the one owner of vLLM's rule.
            info = info.with_detail(detail);
        }
        Ok(PyIteration {
            info,
            request_ids,
            shares,
        })
    }

    /// The ids of the requests this iteration serves, if given: recorded for captured
    /// iterations with `"stepscope": {"request_ids": true}`.
    #[getter]
    fn request_ids(&self) -> Option<Vec<String>> {
        self.request_ids.clone()
    }

    /// The tokens scheduled for each request, in the order of `request_ids`, if given.
    #[getter]
    fn request_tokens(&self) -> Option<Vec<u32>> {
        (!self.shares.is_empty()).then(|| self.shares.iter().map(|s| s.tokens).collect())
    }

    /// Whether each request is in prefill (else decode), in the order of `request_ids`, if
    /// given.
    #[getter]
    fn request_prefill(&self) -> Option<Vec<bool>> {
        (!self.shares.is_empty()).then(|| self.shares.iter().map(|s| s.prefill).collect())
    }

    #[getter]
    fn num_ctx_reqs(&self) -> u32 {
        self.info.num_ctx_reqs
    }
    #[getter]
    fn num_ctx_tokens(&self) -> u32 {
        self.info.num_ctx_tokens
    }
    #[getter]
    fn num_gen_reqs(&self) -> u32 {
        self.info.num_gen_reqs
    }
    #[getter]
    fn num_gen_tokens(&self) -> u32 {
        self.info.num_gen_tokens
    }

    /// `prefill`, `decode`, `mixed` or `idle`.
    #[getter]
    fn stage(&self) -> &'static str {
        self.info.stage().as_str()
    }

    /// vLLM's annotation name of this iteration, simple or detailed.
    #[pyo3(signature = (detailed = false))]
    fn name(&self, detailed: bool) -> String {
        self.info.name(detailed)
    }

    fn __repr__(&self) -> String {
        let i = &self.info;
        format!(
            "Iteration(num_ctx_reqs={}, num_ctx_tokens={}, num_gen_reqs={}, num_gen_tokens={})",
            i.num_ctx_reqs, i.num_ctx_tokens, i.num_gen_reqs, i.num_gen_tokens
        )
    }
}
