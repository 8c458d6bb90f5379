//! The command line's part in each step's floor (`--model`, `--peak-tflops`, `--peak-gbs`):
//! applied to every summary read, which computes the floors itself
//! (`Summary::apply_floor`, the format crate's one owner of the formulas).

use stepscope_format::model::ModelShape;
use stepscope_format::trace::{PeakOverride, Summary};

use crate::error::Error;
use crate::flags::FloorArgs;

/// The shape `--model` names, with `--tensor-parallel`; `None` without `--model`.
pub fn model_of(args: &FloorArgs) -> Result<Option<ModelShape>, Error> {
    let Some(path) = &args.model else {
        return Ok(None);
    };
    let bad = |message: String| Error::Usage(format!("--model {}: {message}", path.display()));
    let text = std::fs::read_to_string(path).map_err(|e| bad(e.to_string()))?;
    let config: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| bad(format!("not JSON: {e}")))?;
    if !config.is_object() {
        return Err(bad("not a JSON object (a Hugging Face config.json)".into()));
    }
    let mut shape = ModelShape::from_hf_config(&config);
    shape.tensor_parallel = Some(args.tensor_parallel.unwrap_or(1));
    Ok(Some(shape))
}

/// Each summary's floors recomputed with the command line's model and peaks (a summary
/// computed its own, with what its trace recorded, when it was made).
pub fn apply<'a>(
    summaries: impl IntoIterator<Item = &'a mut Summary>,
    args: &FloorArgs,
) -> Result<(), Error> {
    let model = model_of(args)?;
    let given = PeakOverride {
        tflops: args.peak_tflops,
        gbs: args.peak_gbs,
    };
    if model.is_none() && given == PeakOverride::default() {
        return Ok(());
    }
    for s in summaries {
        if let Some(m) = &model {
            s.model = Some(m.clone());
        }
        s.apply_floor(given);
    }
    Ok(())
}
