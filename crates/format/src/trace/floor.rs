//! How close each step ran to the fastest it could: its floor, the larger of its FLOPs at the
//! device's peak compute and its bytes at the device's memory bandwidth, from the step's work
//! (`StepWork`: tokens and context lengths per phase) and the served model's shape
//! ([`ModelShape`]). Formulas and their assumptions here and in docs/analyze.md.
//!
//! Per step, on one tensor-parallel rank (`tp` ranks split the weights and heads), for a dense
//! decoder of `L` layers, hidden size `h`, `n` query and `k` key/value heads of dimension `d`,
//! MLP width `i` (three projections when gated, else two), vocabulary `v`, with `T` tokens
//! scheduled and `R` requests (each computes the logits of one token):
//!
//! - weights per layer `W = h·n·d + 2·h·k·d + n·d·h + m·h·i` (`m` projections);
//! - FLOPs `= (2·T·L·W + 2·R·h·v) / tp + 4·L·(n/tp)·d·P`, `P` the causal query-key pairs
//!   (`PhaseWork::causal_pairs`: each new token against the context before it and the new
//!   tokens up to itself);
//! - bytes `= (L·W + h·v)·b_w / tp` (every weight read once a step; the embedding table is
//!   only gathered, left out) `+ L·2·k_r·d·b_kv·(Σkv + Σq)` (the KV read over each request's
//!   context, and the new tokens' KV written), `k_r = max(1, k/tp)` heads per rank.
//!   Activations are left out: at the batch sizes of serving they are small beside the
//!   weights and KV (a lower bound stays a lower bound).
//! - floor `= max(FLOPs / peak FLOP/s, bytes / peak B/s)`; the roof that gives it binds.
//!
//! The peak compute is the device's dense (no sparsity) tensor rate for the weights' dtype:
//! 16-bit for bf16/fp16, FP8 for 8-bit weights where the device has it, FP32 for fp32.

use serde::{Deserialize, Serialize};

use super::header::StepWork;
use crate::model::{dtype_bytes, ModelShape};

/// A device's peaks, dense, from its vendor's data sheet.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DevicePeaks {
    /// What the device's `deviceProperties` name contains (all of them, case-insensitive).
    pub matches: &'static [&'static str],
    /// The device, for the text.
    pub name: &'static str,
    /// Dense 16-bit (BF16/FP16) tensor TFLOP/s.
    pub tflops_16: f64,
    /// Dense FP8 tensor TFLOP/s, where the device has FP8.
    pub tflops_fp8: Option<f64>,
    /// FP32 (non-tensor) TFLOP/s.
    pub tflops_32: f64,
    /// Memory bandwidth, GB/s.
    pub gbs: f64,
    /// Where the figures come from.
    pub source: &'static str,
}

/// The table, most specific names first (an `H100 PCIe` is not an `H100` SXM).
pub const DEVICES: [DevicePeaks; 11] = [
    DevicePeaks {
        matches: &["h100", "pcie"],
        name: "H100 PCIe",
        tflops_16: 756.5,
        tflops_fp8: Some(1513.0),
        tflops_32: 51.2,
        gbs: 2000.0,
        source: "NVIDIA H100 Tensor Core GPU datasheet (PCIe)",
    },
    DevicePeaks {
        matches: &["h100", "nvl"],
        name: "H100 NVL",
        tflops_16: 835.5,
        tflops_fp8: Some(1671.0),
        tflops_32: 59.8,
        gbs: 3900.0,
        source: "NVIDIA H100 Tensor Core GPU datasheet (NVL)",
    },
    DevicePeaks {
        matches: &["h100"],
        name: "H100 SXM",
        tflops_16: 989.4,
        tflops_fp8: Some(1978.9),
        tflops_32: 66.9,
        gbs: 3350.0,
        source: "NVIDIA H100 Tensor Core GPU datasheet (SXM)",
    },
    DevicePeaks {
        matches: &["h200"],
        name: "H200",
        tflops_16: 989.4,
        tflops_fp8: Some(1978.9),
        tflops_32: 66.9,
        gbs: 4800.0,
        source: "NVIDIA H200 Tensor Core GPU datasheet (SXM)",
    },
    DevicePeaks {
        matches: &["a100", "pcie", "80gb"],
        name: "A100 PCIe 80 GB",
        tflops_16: 312.0,
        tflops_fp8: None,
        tflops_32: 19.5,
        gbs: 1935.0,
        source: "NVIDIA A100 Tensor Core GPU datasheet",
    },
    DevicePeaks {
        matches: &["a100", "80gb"],
        name: "A100 SXM 80 GB",
        tflops_16: 312.0,
        tflops_fp8: None,
        tflops_32: 19.5,
        gbs: 2039.0,
        source: "NVIDIA A100 Tensor Core GPU datasheet",
    },
    DevicePeaks {
        matches: &["a100"],
        name: "A100 40 GB",
        tflops_16: 312.0,
        tflops_fp8: None,
        tflops_32: 19.5,
        gbs: 1555.0,
        source: "NVIDIA A100 Tensor Core GPU datasheet",
    },
    DevicePeaks {
        matches: &["l40s"],
        name: "L40S",
        tflops_16: 362.05,
        tflops_fp8: Some(733.0),
        tflops_32: 91.6,
        gbs: 864.0,
        source: "NVIDIA L40S GPU datasheet",
    },
    DevicePeaks {
        matches: &["b200"],
        name: "B200",
        tflops_16: 2250.0,
        tflops_fp8: Some(4500.0),
        tflops_32: 75.0,
        gbs: 8000.0,
        source: "NVIDIA HGX B200 datasheet (per GPU)",
    },
    DevicePeaks {
        matches: &["mi300x"],
        name: "MI300X",
        tflops_16: 1307.4,
        tflops_fp8: Some(2614.9),
        tflops_32: 163.4,
        gbs: 5300.0,
        source: "AMD Instinct MI300X accelerator data sheet",
    },
    DevicePeaks {
        matches: &["gh200"],
        name: "GH200 (H100 96 GB)",
        tflops_16: 989.4,
        tflops_fp8: Some(1978.9),
        tflops_32: 66.9,
        gbs: 4000.0,
        source: "NVIDIA GH200 Grace Hopper Superchip datasheet",
    },
];

impl DevicePeaks {
    /// The table's entry for a `deviceProperties` name.
    pub fn of(device: &str) -> Option<&'static DevicePeaks> {
        let d = device.to_ascii_lowercase();
        // GH200 names hold "h100" too: the superchip first.
        if d.contains("gh200") {
            return DEVICES.iter().find(|p| p.matches == ["gh200"]);
        }
        DEVICES
            .iter()
            .find(|p| p.matches.iter().all(|m| d.contains(m)))
    }

    /// The dense tensor rate for weights of `bytes` per element, TFLOP/s.
    pub fn tflops_for(&self, bytes: f64) -> f64 {
        if bytes <= 1.0 {
            self.tflops_fp8.unwrap_or(self.tflops_16)
        } else if bytes <= 2.0 {
            self.tflops_16
        } else {
            self.tflops_32
        }
    }
}

/// The peaks a floor was computed with.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Peaks {
    /// Peak compute, TFLOP/s.
    pub tflops: f64,
    /// Peak memory bandwidth, GB/s.
    pub gbs: f64,
    /// Where they come from: the table's device and source, or `--peak-tflops`/`--peak-gbs`.
    pub source: String,
}

/// The peaks given on the command line, each overriding the table's.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PeakOverride {
    /// `--peak-tflops`.
    pub tflops: Option<f64>,
    /// `--peak-gbs`.
    pub gbs: Option<f64>,
}

/// Which roof a floor comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Roof {
    /// FLOPs at peak compute.
    Compute,
    /// Bytes at peak bandwidth.
    Memory,
}

impl Roof {
    /// `compute` or `memory bandwidth`.
    pub fn as_str(self) -> &'static str {
        match self {
            Roof::Compute => "compute",
            Roof::Memory => "memory bandwidth",
        }
    }
}

/// One step against its floor.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Floor {
    /// FLOPs on one rank.
    pub flops: f64,
    /// Bytes moved to and from device memory on one rank.
    pub bytes: f64,
    /// FLOPs at peak compute, µs.
    pub compute_us: f64,
    /// Bytes at peak bandwidth, µs.
    pub memory_us: f64,
    /// The larger: the fastest the step could run, µs.
    pub floor_us: f64,
    /// The roof that gives it.
    pub bound: Roof,
    /// The floor over the step's wall time (1 = at the floor).
    pub of_wall: f64,
    /// The floor over the step's GPU busy time, when it had device work.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub of_busy: Option<f64>,
}

/// A model's per-step cost coefficients, from its shape; or why there are none.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Cost {
    layers: f64,
    /// Weights per layer.
    layer_weights: f64,
    hidden: f64,
    vocab: f64,
    heads_rank: f64,
    kv_heads_rank: f64,
    head_dim: f64,
    tp: f64,
    weight_bytes: f64,
    kv_bytes: f64,
}

impl Cost {
    /// The coefficients of `m`, or the names of the fields it lacks.
    pub fn of(m: &ModelShape) -> Result<Cost, String> {
        let mut missing: Vec<&str> = Vec::new();
        let mut need = |v: Option<u32>, name: &'static str| {
            if v.is_none() {
                missing.push(name);
            }
            f64::from(v.unwrap_or(0))
        };
        let layers = need(m.layers, "layers");
        let hidden = need(m.hidden_size, "hidden_size");
        let heads = need(m.heads, "heads");
        let kv_heads = f64::from(m.kv_heads.or(m.heads).unwrap_or(0));
        let head_dim = need(m.head_dim(), "head_dim");
        let inter = need(m.intermediate_size, "intermediate_size");
        let vocab = need(m.vocab_size, "vocab_size");
        if m.gated_mlp.is_none() {
            missing.push("gated_mlp");
        }
        let weight_bytes = m.weight_dtype.as_deref().and_then(dtype_bytes);
        if weight_bytes.is_none() {
            missing.push("weight_dtype");
        }
        if m.experts.is_some_and(|e| e > 0) {
            return Err(
                "a mixture-of-experts model (its routed and shared experts' reads are not \
                 modelled)"
                    .into(),
            );
        }
        if !missing.is_empty() {
            return Err(format!("the model shape lacks {}", missing.join(", ")));
        }
        let weight_bytes = weight_bytes.unwrap_or(2.0);
        let kv_bytes = m
            .kv_cache_dtype
            .as_deref()
            .and_then(dtype_bytes)
            .unwrap_or(weight_bytes);
        let tp = f64::from(m.tensor_parallel.unwrap_or(1).max(1));
        let projections = if m.gated_mlp == Some(true) { 3.0 } else { 2.0 };
        let attn = hidden * heads * head_dim * 2.0 + 2.0 * hidden * kv_heads * head_dim;
        Ok(Cost {
            layers,
            layer_weights: attn + projections * hidden * inter,
            hidden,
            vocab,
            heads_rank: heads / tp,
            kv_heads_rank: (kv_heads / tp).max(1.0),
            head_dim,
            tp,
            weight_bytes,
            kv_bytes,
        })
    }

    /// The weights' bytes per element.
    pub fn weight_bytes(&self) -> f64 {
        self.weight_bytes
    }

    /// A step's FLOPs on one rank.
    pub fn flops(&self, w: &StepWork) -> f64 {
        let tokens = w.tokens() as f64;
        let requests = w.requests() as f64;
        let pairs = w.context.causal_pairs() + w.generation.causal_pairs();
        (2.0 * tokens * self.layers * self.layer_weights
            + 2.0 * requests * self.hidden * self.vocab)
            / self.tp
            + 4.0 * self.layers * self.heads_rank * self.head_dim * pairs
    }

    /// A step's bytes on one rank.
    pub fn bytes(&self, w: &StepWork) -> f64 {
        let weights = (self.layers * self.layer_weights + self.hidden * self.vocab)
            * self.weight_bytes
            / self.tp;
        let kv_token = self.layers * 2.0 * self.kv_heads_rank * self.head_dim * self.kv_bytes;
        let kv = (w.context.sk + w.generation.sk + w.tokens()) as f64 * kv_token;
        weights + kv
    }

    /// A step against its floor.
    pub fn floor(&self, w: &StepWork, peaks: &Peaks, wall_us: f64, busy_us: Option<f64>) -> Floor {
        let flops = self.flops(w);
        let bytes = self.bytes(w);
        let compute_us = flops / (peaks.tflops * 1e12) * 1e6;
        let memory_us = bytes / (peaks.gbs * 1e9) * 1e6;
        let (floor_us, bound) = if compute_us >= memory_us {
            (compute_us, Roof::Compute)
        } else {
            (memory_us, Roof::Memory)
        };
        let ratio = |t: f64| if t > 0.0 { floor_us / t } else { 0.0 };
        Floor {
            flops,
            bytes,
            compute_us,
            memory_us,
            floor_us,
            bound,
            of_wall: ratio(wall_us),
            of_busy: busy_us.filter(|b| *b > 0.0).map(ratio),
        }
    }
}

/// The peaks for a trace: the table's for its device (the first `deviceProperties` name),
/// each overridden by the command line's; or why there are none.
pub fn peaks(
    device: Option<&str>,
    weight_bytes: f64,
    given: PeakOverride,
) -> Result<Peaks, String> {
    let table = device.and_then(DevicePeaks::of);
    let tflops = given
        .tflops
        .or_else(|| table.map(|t| t.tflops_for(weight_bytes)));
    let gbs = given.gbs.or_else(|| table.map(|t| t.gbs));
    match (tflops, gbs) {
        (Some(tflops), Some(gbs)) if tflops > 0.0 && gbs > 0.0 => Ok(Peaks {
            tflops,
            gbs,
            source: match (table, given.tflops, given.gbs) {
                (_, Some(_), Some(_)) => "--peak-tflops, --peak-gbs".into(),
                (Some(t), None, None) => format!("{} ({})", t.name, t.source),
                (Some(t), _, _) => format!("{} ({}), with the command line's", t.name, t.source),
                (None, _, _) => "--peak-tflops, --peak-gbs".into(),
            },
        }),
        _ => Err(match device {
            Some(d) => format!(
                "no peaks for device {d:?} (not in stepscope's table: give --peak-tflops and \
                 --peak-gbs)"
            ),
            None => "the trace names no device (give --peak-tflops and --peak-gbs)".into(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_are_found_by_their_properties_name() {
        let name = |d: &str| DevicePeaks::of(d).map(|p| p.name);
        assert_eq!(name("NVIDIA H100 80GB HBM3"), Some("H100 SXM"));
        assert_eq!(name("NVIDIA H100 PCIe"), Some("H100 PCIe"));
        assert_eq!(name("NVIDIA H100 NVL"), Some("H100 NVL"));
        assert_eq!(name("NVIDIA H200"), Some("H200"));
        assert_eq!(name("NVIDIA GH200 480GB"), Some("GH200 (H100 96 GB)"));
        assert_eq!(name("NVIDIA A100-SXM4-80GB"), Some("A100 SXM 80 GB"));
        assert_eq!(name("NVIDIA A100-PCIE-80GB"), Some("A100 PCIe 80 GB"));
        assert_eq!(name("NVIDIA A100-SXM4-40GB"), Some("A100 40 GB"));
        assert_eq!(name("NVIDIA L40S"), Some("L40S"));
        assert_eq!(name("NVIDIA B200"), Some("B200"));
        assert_eq!(name("AMD Instinct MI300X"), Some("MI300X"));
        assert_eq!(name("Tesla T4"), None);
        let h100 = DevicePeaks::of("NVIDIA H100 80GB HBM3").unwrap();
        assert_eq!(
            (
                h100.tflops_for(1.0),
                h100.tflops_for(2.0),
                h100.tflops_for(4.0)
            ),
            (1978.9, 989.4, 66.9)
        );
        // No FP8 on an A100: 8-bit weights run at the 16-bit rate.
        assert_eq!(
            DevicePeaks::of("A100-SXM4-40GB").unwrap().tflops_for(1.0),
            312.0
        );
    }
}
