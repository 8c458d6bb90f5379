//! A toy inference engine on libtorch: each iteration runs a few matmuls sized by its batch,
//! and reports the batch to stepscope as vLLM would (context and generation requests and
//! tokens). The demo, the torch backend's tests and its bench drive this loop.

use stepscope::{IterationInfo, WorkerProfiler};
use tch::{Device, Kind, Tensor};

/// The model: a stack of square weight matrices.
pub struct ToyEngine {
    layers: Vec<Tensor>,
    hidden: i64,
}

impl ToyEngine {
    /// `layers` matmuls of width `hidden` per iteration.
    pub fn new(layers: usize, hidden: i64) -> Self {
        tch::manual_seed(0);
        let layers = (0..layers)
            .map(|_| Tensor::randn([hidden, hidden], (Kind::Float, Device::Cpu)))
            .collect();
        ToyEngine { layers, hidden }
    }

    /// The batch of iteration `step` (1-based): a prefill every fourth iteration, decodes
    /// otherwise, growing then shrinking, like a short serving burst.
    pub fn batch(step: u64) -> IterationInfo {
        let decode = 2 + (step % 5) as u32;
        if step % 4 == 1 {
            IterationInfo::new(1, 16 + step as u32, decode, decode)
        } else {
            IterationInfo::new(0, 0, decode, decode)
        }
    }

    /// Runs one iteration's model work for `tokens` tokens.
    pub fn forward(&self, tokens: u32) -> f64 {
        let mut x = Tensor::ones(
            [i64::from(tokens.max(1)), self.hidden],
            (Kind::Float, Device::Cpu),
        );
        for w in &self.layers {
            x = x.mm(w).relu();
        }
        x.sum(Kind::Float).double_value(&[])
    }

    /// One engine iteration as an engine runs it: `step()` with the batch, then the model.
    pub fn iteration(&self, profiler: &WorkerProfiler, step: u64) -> f64 {
        let info = Self::batch(step);
        let _iteration = profiler.step(&info);
        self.forward(info.num_ctx_tokens + info.num_gen_tokens)
    }
}
