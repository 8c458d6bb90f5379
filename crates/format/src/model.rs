//! The served model's shape, as the engine plugins record it in a trace's header and manifest
//! (`"model"`): what a step's floor is computed from (`trace/floor.rs`). One type, written by
//! the profiler (`WorkerProfiler::set_model`) and read back by `analyze`.
//!
//! Every figure is optional: what a plugin could not tell is absent and named in
//! [`ModelShape::unknown`], never guessed.

use serde::{Deserialize, Serialize};

/// The model a worker serves, per the engine's model config (Hugging Face `config.json`
/// names in comments).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelShape {
    /// `architectures[0]`, e.g. `LlamaForCausalLM`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub architecture: Option<String>,
    /// Decoder layers (`num_hidden_layers`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layers: Option<u32>,
    /// `hidden_size`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hidden_size: Option<u32>,
    /// Query heads (`num_attention_heads`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heads: Option<u32>,
    /// Key/value heads (`num_key_value_heads`; equal to `heads` without GQA).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_heads: Option<u32>,
    /// `head_dim` (else `hidden_size / heads`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub head_dim: Option<u32>,
    /// The MLP's inner width (`intermediate_size`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub intermediate_size: Option<u32>,
    /// Whether the MLP is gated (gate, up and down projections: SwiGLU/GeGLU), else two
    /// projections.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gated_mlp: Option<bool>,
    /// `vocab_size`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vocab_size: Option<u32>,
    /// Parameters this rank holds, as loaded (the whole model's without tensor parallelism).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub params: Option<u64>,
    /// The weights' dtype (`bfloat16`, `float16`, `float32`, `fp8`, …).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight_dtype: Option<String>,
    /// The KV cache's dtype.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_cache_dtype: Option<String>,
    /// Tensor-parallel ranks the weights and heads are split over.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tensor_parallel: Option<u32>,
    /// Routed experts of a mixture-of-experts model (absent for a dense one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub experts: Option<u32>,
    /// Experts each token is routed to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub experts_per_token: Option<u32>,
    /// The fields the plugin could not tell (e.g. `experts_per_token` of an MoE whose config
    /// does not say), by name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unknown: Vec<String>,
}

impl ModelShape {
    /// Reads a shape from its JSON, an error naming the bad field.
    pub fn from_json(text: &str) -> Result<Self, String> {
        serde_json::from_str(text).map_err(|e| format!("model shape: {e}"))
    }

    /// The shape a Hugging Face `config.json` (or a model config's `to_dict()`) gives: its
    /// text model's (`text_config` when there is one). Fields the config does not hold are
    /// listed in [`ModelShape::unknown`]; dtypes, tensor parallelism and the parameter count
    /// are the engine's to add.
    pub fn from_hf_config(config: &serde_json::Value) -> Self {
        let c = config
            .get("text_config")
            .filter(|t| t.is_object())
            .unwrap_or(config);
        let num = |keys: &[&str]| -> Option<u32> {
            keys.iter()
                .find_map(|k| c.get(*k).and_then(serde_json::Value::as_u64))
                .and_then(|n| u32::try_from(n).ok())
        };
        let architecture = config
            .get("architectures")
            .and_then(|a| a.get(0))
            .and_then(|a| a.as_str())
            .map(str::to_string);
        let heads = num(&["num_attention_heads", "n_head"]);
        let hidden_size = num(&["hidden_size", "n_embd", "d_model"]);
        let experts = num(&["num_local_experts", "num_experts", "n_routed_experts"]);
        let mut shape = ModelShape {
            gated_mlp: gated(
                architecture.as_deref(),
                c.get("hidden_act").and_then(|a| a.as_str()),
            ),
            architecture,
            layers: num(&["num_hidden_layers", "n_layer", "num_layers"]),
            hidden_size,
            heads,
            kv_heads: num(&["num_key_value_heads", "num_kv_heads"]).or(heads),
            head_dim: num(&["head_dim"]),
            intermediate_size: num(&["intermediate_size", "n_inner", "ffn_dim"]),
            vocab_size: num(&["vocab_size"]),
            weight_dtype: c
                .get("torch_dtype")
                .or_else(|| config.get("torch_dtype"))
                .and_then(|d| d.as_str())
                .map(str::to_string),
            experts: experts.filter(|e| *e > 0),
            experts_per_token: num(&["num_experts_per_tok", "moe_topk"]),
            ..ModelShape::default()
        };
        let mut unknown = Vec::new();
        for (name, known) in [
            ("architecture", shape.architecture.is_some()),
            ("layers", shape.layers.is_some()),
            ("hidden_size", shape.hidden_size.is_some()),
            ("heads", shape.heads.is_some()),
            ("head_dim", shape.head_dim().is_some()),
            ("intermediate_size", shape.intermediate_size.is_some()),
            ("gated_mlp", shape.gated_mlp.is_some()),
            ("vocab_size", shape.vocab_size.is_some()),
            (
                "experts_per_token",
                shape.experts.is_none() || shape.experts_per_token.is_some(),
            ),
        ] {
            if !known {
                unknown.push(name.to_string());
            }
        }
        shape.unknown = unknown;
        shape
    }

    /// The head dimension: `head_dim`, else `hidden_size / heads`.
    pub fn head_dim(&self) -> Option<u32> {
        self.head_dim.or_else(|| {
            let (h, n) = (self.hidden_size?, self.heads?);
            (n > 0).then(|| h / n)
        })
    }
}

/// Whether an architecture's MLP is gated (three projections: SwiGLU, GeGLU), by its
/// family, else by its activation (`silu` is SwiGLU's); `None` when neither tells.
fn gated(architecture: Option<&str>, act: Option<&str>) -> Option<bool> {
    const GATED: [&str; 13] = [
        "Llama", "Mistral", "Mixtral", "Qwen", "Gemma", "Phi3", "Deepseek", "InternLM", "Yi",
        "Baichuan", "Granite", "Olmo", "Cohere",
    ];
    const PLAIN: [&str; 7] = ["GPT2", "GPTNeoX", "GPTJ", "OPT", "Bloom", "Falcon", "Phi"];
    if let Some(a) = architecture {
        if GATED.iter().any(|g| a.starts_with(g)) {
            return Some(true);
        }
        if PLAIN.iter().any(|g| a.starts_with(g)) {
            return Some(false);
        }
    }
    match act? {
        "silu" | "swiglu" => Some(true),
        _ => None,
    }
}

/// Bytes per element of a dtype as engines name it (`torch.bfloat16`, `bfloat16`, `bf16`,
/// `fp8_e4m3`, `auto`, …); `None` when unknown (`auto` included: the caller resolves it).
pub fn dtype_bytes(dtype: &str) -> Option<f64> {
    let d = dtype
        .trim()
        .trim_start_matches("torch.")
        .to_ascii_lowercase();
    Some(match d.as_str() {
        "bfloat16" | "bf16" | "float16" | "fp16" | "half" => 2.0,
        "float32" | "fp32" | "float" => 4.0,
        "float64" | "double" => 8.0,
        _ if d.starts_with("fp8") || d.starts_with("float8") || d == "int8" || d == "uint8" => 1.0,
        "int4" | "fp4" | "nvfp4" | "mxfp4" => 0.5,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shape_reads_back_and_a_bad_field_is_named() {
        let s = ModelShape {
            architecture: Some("LlamaForCausalLM".into()),
            layers: Some(2),
            unknown: vec!["params".into()],
            ..ModelShape::default()
        };
        let text = serde_json::to_string(&s).unwrap();
        assert_eq!(ModelShape::from_json(&text).unwrap(), s);
        let e = ModelShape::from_json(r#"{"layrs": 2}"#).unwrap_err();
        assert!(e.contains("unknown field `layrs`"), "{e}");
        let e = ModelShape::from_json(r#"{"layers": -1}"#).unwrap_err();
        assert!(e.contains("layers") || e.contains("-1"), "{e}");
    }

    #[test]
    fn a_hugging_face_config_gives_the_shape_and_names_what_it_lacks() {
        let llama: serde_json::Value = serde_json::json!({
            "architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "intermediate_size": 14336,
            "num_attention_heads": 32, "num_key_value_heads": 8, "num_hidden_layers": 32,
            "vocab_size": 128256, "hidden_act": "silu", "torch_dtype": "bfloat16"
        });
        let s = ModelShape::from_hf_config(&llama);
        assert_eq!(
            (
                s.layers,
                s.heads,
                s.kv_heads,
                s.head_dim(),
                s.gated_mlp,
                s.experts
            ),
            (Some(32), Some(32), Some(8), Some(128), Some(true), None)
        );
        assert!(s.unknown.is_empty(), "{:?}", s.unknown);
        // An MoE that does not say how many experts a token visits.
        let moe =
            serde_json::json!({"architectures": ["MixtralForCausalLM"], "num_local_experts": 8});
        let s = ModelShape::from_hf_config(&moe);
        assert_eq!(s.experts, Some(8));
        assert!(
            s.unknown.contains(&"experts_per_token".to_string()),
            "{:?}",
            s.unknown
        );
        // A multimodal config's text model.
        let vl =
            serde_json::json!({"architectures": ["X"], "text_config": {"num_hidden_layers": 4}});
        assert_eq!(ModelShape::from_hf_config(&vl).layers, Some(4));
    }

    #[test]
    fn dtypes_have_their_sizes() {
        assert_eq!(dtype_bytes("torch.bfloat16"), Some(2.0));
        assert_eq!(dtype_bytes("fp8_e4m3"), Some(1.0));
        assert_eq!(dtype_bytes("float32"), Some(4.0));
        assert_eq!(dtype_bytes("auto"), None);
    }
}
