//! The `/start_profile` body: the fields a user gave, in the workers' dialect.

use serde_json::{json, Map, Value};

use crate::flags::{Engine, StartFields};

/// The JSON body for `/start_profile`: only the fields given. A field of the other dialect is
/// a usage error naming the flag to use instead.
pub fn start_body(engine: Engine, f: &StartFields) -> Result<Value, String> {
    let mut body = Map::new();
    let vllm_only = [
        ("--profile-prefix", f.profile_prefix.is_some()),
        ("--delay-iterations", f.delay_iterations.is_some()),
        ("--max-iterations", f.max_iterations.is_some()),
    ];
    let sglang_only = [
        ("--output-dir", f.output_dir.is_some()),
        ("--num-steps", f.num_steps.is_some()),
        ("--activities", f.activities.is_some()),
        ("--profile-by-stage", f.profile_by_stage),
        ("--with-stack", f.with_stack.is_some()),
        ("--record-shapes", f.record_shapes.is_some()),
    ];
    match engine {
        Engine::Vllm => {
            if let Some((flag, _)) = sglang_only.iter().find(|(_, set)| *set) {
                return Err(format!(
                    "{flag} is an SGLang field; add --engine sglang, or with vLLM use \
                     --delay-iterations/--max-iterations/--profile-prefix"
                ));
            }
            if let Some(p) = &f.profile_prefix {
                body.insert("profile_prefix".into(), json!(p));
            }
            if let Some(d) = f.delay_iterations {
                body.insert("delay_iterations".into(), json!(d));
            }
            if let Some(m) = f.max_iterations {
                body.insert("max_iterations".into(), json!(m));
            }
        }
        Engine::Sglang => {
            if let Some((flag, _)) = vllm_only.iter().find(|(_, set)| *set) {
                return Err(format!(
                    "{flag} is a vLLM field; with --engine sglang use --num-steps/--output-dir"
                ));
            }
            if let Some(d) = &f.output_dir {
                body.insert("output_dir".into(), json!(d));
            }
            if let Some(n) = f.num_steps {
                body.insert("num_steps".into(), json!(n));
            }
            if let Some(a) = &f.activities {
                body.insert("activities".into(), json!(a));
            }
            if f.profile_by_stage {
                body.insert("profile_by_stage".into(), json!(true));
            }
            if let Some(v) = f.with_stack {
                body.insert("with_stack".into(), json!(v));
            }
            if let Some(v) = f.record_shapes {
                body.insert("record_shapes".into(), json!(v));
            }
        }
    }
    Ok(Value::Object(body))
}
