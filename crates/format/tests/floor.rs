//! A step's FLOPs, bytes and floor against a calculation written here, module by module and
//! request by request, independently of `floor.rs`'s closed forms: a Llama-2-7B-shaped model
//! (multi-head attention) decoding a batch, and a Llama-3-8B-shaped one (grouped-query
//! attention, two tensor-parallel ranks) running a chunked prefill beside decodes.

use stepscope_format::model::ModelShape;
use stepscope_format::trace::{Cost, DevicePeaks, PeakOverride, PhaseWork, Roof, StepWork};

/// A request's part of a step: tokens scheduled (`q`) and tokens already computed.
struct Req {
    q: u64,
    computed: u64,
    prefill: bool,
}

/// The step's work as an engine records it: per phase, Σq, Σkv, Σq², Σq·kv.
fn work(reqs: &[Req]) -> StepWork {
    let mut w = StepWork::default();
    for r in reqs {
        let p = if r.prefill {
            &mut w.context
        } else {
            &mut w.generation
        };
        let kv = r.computed + r.q;
        p.requests += 1;
        p.sq += r.q;
        p.sk += kv;
        p.sqsq += r.q * r.q;
        p.sqsk += r.q * kv;
    }
    w
}

struct Llama {
    layers: u64,
    hidden: u64,
    heads: u64,
    kv_heads: u64,
    head_dim: u64,
    inter: u64,
    vocab: u64,
    tp: u64,
}

impl Llama {
    fn shape(&self) -> ModelShape {
        ModelShape {
            architecture: Some("LlamaForCausalLM".into()),
            layers: Some(self.layers as u32),
            hidden_size: Some(self.hidden as u32),
            heads: Some(self.heads as u32),
            kv_heads: Some(self.kv_heads as u32),
            head_dim: Some(self.head_dim as u32),
            intermediate_size: Some(self.inter as u32),
            gated_mlp: Some(true),
            vocab_size: Some(self.vocab as u32),
            weight_dtype: Some("bfloat16".into()),
            kv_cache_dtype: Some("auto".into()),
            tensor_parallel: Some(self.tp as u32),
            ..ModelShape::default()
        }
    }

    /// The weight matrices of one layer, (rows, columns), on one rank.
    fn matrices(&self) -> Vec<(u64, u64)> {
        let (h, q, kv) = (
            self.hidden,
            self.heads * self.head_dim / self.tp,
            self.kv_heads * self.head_dim / self.tp,
        );
        let i = self.inter / self.tp;
        vec![
            (h, q),  // q_proj
            (h, kv), // k_proj
            (h, kv), // v_proj
            (q, h),  // o_proj
            (h, i),  // gate_proj
            (h, i),  // up_proj
            (i, h),  // down_proj
        ]
    }

    /// FLOPs on one rank: every token through every matrix (2 per multiply-add), the logits
    /// of one token per request, and attention: each new token's query against every key up
    /// to its own position, QKᵀ and PV, per head on this rank.
    fn flops(&self, reqs: &[Req]) -> f64 {
        let tokens: u64 = reqs.iter().map(|r| r.q).sum();
        let per_token: u64 = self.matrices().iter().map(|(r, c)| 2 * r * c).sum();
        let mut f = (tokens * self.layers * per_token) as f64;
        f += (reqs.len() as u64 * 2 * self.hidden * self.vocab / self.tp) as f64;
        let heads = self.heads / self.tp;
        for r in reqs {
            for t in 0..r.q {
                let keys = r.computed + t + 1;
                f += (self.layers * heads * (2 * self.head_dim * keys + 2 * self.head_dim * keys))
                    as f64;
            }
        }
        f
    }

    /// Bytes on one rank: every weight once (bf16), the LM head once, and per request the
    /// KV of its whole context read and its new tokens' KV written, for this rank's KV
    /// heads (bf16).
    fn bytes(&self, reqs: &[Req]) -> f64 {
        let weights: u64 = self.matrices().iter().map(|(r, c)| r * c).sum::<u64>() * self.layers
            + self.hidden * self.vocab / self.tp;
        let kv_heads = (self.kv_heads / self.tp).max(1);
        let kv_per_token_layer = 2 * kv_heads * self.head_dim * 2; // K and V, 2 bytes each
        let mut b = (weights * 2) as f64;
        for r in reqs {
            let read = r.computed + r.q;
            let written = r.q;
            b += ((read + written) * self.layers * kv_per_token_layer) as f64;
        }
        b
    }
}

fn close(what: &str, ours: f64, expected: f64) {
    assert!(
        (ours - expected).abs() <= 1e-9 * expected.abs(),
        "{what}: {ours} against {expected}"
    );
}

#[test]
fn a_dense_model_decoding_64_requests_is_bound_by_memory_bandwidth() {
    let m = Llama {
        layers: 32,
        hidden: 4096,
        heads: 32,
        kv_heads: 32,
        head_dim: 128,
        inter: 11008,
        vocab: 32000,
        tp: 1,
    };
    let reqs: Vec<Req> = (0..64)
        .map(|_| Req {
            q: 1,
            computed: 1000,
            prefill: false,
        })
        .collect();
    let w = work(&reqs);
    let cost = Cost::of(&m.shape()).unwrap();
    close("flops", cost.flops(&w), m.flops(&reqs));
    close("bytes", cost.bytes(&w), m.bytes(&reqs));

    let peaks = stepscope_format::trace::Peaks {
        tflops: DevicePeaks::of("NVIDIA H100 80GB HBM3").unwrap().tflops_16,
        gbs: 3350.0,
        source: "test".into(),
    };
    let f = cost.floor(&w, &peaks, 20_000.0, Some(10_000.0));
    let memory_us = m.bytes(&reqs) / 3350e9 * 1e6;
    let compute_us = m.flops(&reqs) / 989.4e12 * 1e6;
    assert!(memory_us > compute_us);
    assert_eq!(f.bound, Roof::Memory);
    close("floor", f.floor_us, memory_us);
    close("of wall", f.of_wall, memory_us / 20_000.0);
    close("of busy", f.of_busy.unwrap(), memory_us / 10_000.0);
    // About 13.5 GB of weights and 33.6 GB of KV (32 KV heads: 0.5 MB a token, 64 contexts
    // of 1,001): about 14 ms on an H100 SXM.
    assert!((13_500.0..14_500.0).contains(&f.floor_us), "{}", f.floor_us);
}

#[test]
fn a_gqa_model_on_two_ranks_prefilling_a_chunk_is_bound_by_compute() {
    let m = Llama {
        layers: 32,
        hidden: 4096,
        heads: 32,
        kv_heads: 8,
        head_dim: 128,
        inter: 14336,
        vocab: 128256,
        tp: 2,
    };
    let reqs = vec![
        Req {
            q: 1536,
            computed: 512,
            prefill: true,
        },
        Req {
            q: 1,
            computed: 100,
            prefill: false,
        },
        Req {
            q: 1,
            computed: 200,
            prefill: false,
        },
        Req {
            q: 1,
            computed: 300,
            prefill: false,
        },
    ];
    let w = work(&reqs);
    assert_eq!(
        w.generation,
        PhaseWork {
            requests: 3,
            sq: 3,
            sk: 603,
            sqsq: 3,
            sqsk: 603
        }
    );
    let cost = Cost::of(&m.shape()).unwrap();
    close("flops", cost.flops(&w), m.flops(&reqs));
    close("bytes", cost.bytes(&w), m.bytes(&reqs));
    let peaks =
        stepscope_format::trace::peaks(Some("NVIDIA H100 80GB HBM3"), 2.0, PeakOverride::default())
            .unwrap();
    let f = cost.floor(&w, &peaks, 50_000.0, None);
    assert_eq!(f.bound, Roof::Compute);
    close("floor", f.floor_us, m.flops(&reqs) / 989.4e12 * 1e6);
    assert_eq!(f.of_busy, None);
}

#[test]
fn what_a_floor_cannot_be_computed_without_is_named() {
    let e = Cost::of(&ModelShape::default()).unwrap_err();
    for field in [
        "layers",
        "hidden_size",
        "heads",
        "weight_dtype",
        "gated_mlp",
    ] {
        assert!(e.contains(field), "{e}");
    }
    let moe = ModelShape {
        experts: Some(8),
        ..ModelShape::default()
    };
    assert!(Cost::of(&moe).unwrap_err().contains("mixture-of-experts"));
    let e =
        stepscope_format::trace::peaks(Some("Tesla T4"), 2.0, PeakOverride::default()).unwrap_err();
    assert!(e.contains("Tesla T4") && e.contains("--peak-tflops"), "{e}");
    // The command line's peaks serve any device.
    let p = stepscope_format::trace::peaks(
        Some("Tesla T4"),
        2.0,
        PeakOverride {
            tflops: Some(65.0),
            gbs: Some(320.0),
        },
    )
    .unwrap();
    assert_eq!((p.tflops, p.gbs), (65.0, 320.0));
}
