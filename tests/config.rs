//! Config parsing and validation: vLLM 0.32's fields, defaults and rules, and errors that name
//! the field.

use stepscope::config::{ProfilerKind, TorchActivity};
use stepscope::{Error, ProfilerConfig};

fn err(json: &str) -> Error {
    ProfilerConfig::from_json_str(json).expect_err(json)
}

/// The error names `field` and its message contains `text`.
fn assert_err(json: &str, field: &str, text: &str) {
    let e = err(json);
    assert_eq!(e.field(), Some(field), "{json}: {e}");
    let msg = e.to_string();
    assert!(msg.contains(field), "{msg:?} should name {field}");
    assert!(msg.contains(text), "{msg:?} should contain {text:?}");
}

#[test]
fn empty_object_gives_vllm_defaults() {
    let c = ProfilerConfig::from_json_str("{}").unwrap();
    assert_eq!(c, ProfilerConfig::default());
    assert_eq!(c.profiler, None);
    assert!(c.torch_profiler_with_stack && c.torch_profiler_use_gzip);
    assert!(c.torch_profiler_dump_cuda_time_total);
    assert!(!c.torch_profiler_with_flops && !c.torch_profiler_record_shapes);
    assert!(!c.torch_profiler_with_memory && !c.capture_torch_profiler);
    assert!(!c.detailed_trace_annotation && !c.ignore_frontend);
    assert_eq!(
        (
            c.delay_iterations,
            c.max_iterations,
            c.warmup_iterations,
            c.active_iterations,
            c.wait_iterations
        ),
        (0, 0, 0, 5, 0)
    );
    assert_eq!(c.torch_profiler_activities, None);
}

#[test]
fn every_vllm_field_is_accepted_verbatim() {
    let c = ProfilerConfig::from_json_str(
        r#"{
        "profiler": "torch", "torch_profiler_dir": "/tmp/traces",
        "torch_profiler_activities": ["CPU", "CUDA", "XPU", "PrivateUse1"],
        "torch_profiler_with_stack": false, "torch_profiler_with_flops": true,
        "torch_profiler_use_gzip": false, "torch_profiler_dump_cuda_time_total": false,
        "torch_profiler_record_shapes": true, "torch_profiler_with_memory": true,
        "capture_torch_profiler": true, "detailed_trace_annotation": true,
        "ignore_frontend": true, "delay_iterations": 10, "max_iterations": 4,
        "warmup_iterations": 2, "active_iterations": 3, "wait_iterations": 1,
        "proton_profiler_dir": "", "proton_context": "shadow", "proton_data": "tree",
        "proton_backend": null, "proton_mode": null, "proton_hook": null,
        "proton_output_format": null, "proton_graph_attribution": false,
        "stepscope": {}
    }"#,
    )
    .unwrap();
    assert_eq!(c.profiler, Some(ProfilerKind::Torch));
    assert_eq!(c.torch_profiler_dir, "/tmp/traces");
    assert_eq!(
        c.torch_profiler_activities.as_deref(),
        Some(
            &[
                TorchActivity::Cpu,
                TorchActivity::Cuda,
                TorchActivity::Xpu,
                TorchActivity::PrivateUse1
            ][..]
        )
    );
    assert!(!c.torch_profiler_with_stack && c.torch_profiler_with_flops);
    assert!(!c.torch_profiler_use_gzip && !c.torch_profiler_dump_cuda_time_total);
    assert!(c.torch_profiler_record_shapes && c.torch_profiler_with_memory);
    assert!(c.capture_torch_profiler && c.detailed_trace_annotation && c.ignore_frontend);
    assert_eq!((c.delay_iterations, c.max_iterations), (10, 4));
    assert_eq!(
        (c.warmup_iterations, c.active_iterations, c.wait_iterations),
        (2, 3, 1)
    );
    let cuda = ProfilerConfig::from_json_str(r#"{"profiler": "cuda"}"#).unwrap();
    assert_eq!(cuda.profiler, Some(ProfilerKind::Cuda));
    let none = ProfilerConfig::from_json_str(r#"{"profiler": null}"#).unwrap();
    assert_eq!(none.profiler, None);
}

#[test]
fn profiler_kind_is_checked() {
    assert_err(
        r#"{"profiler": "proton", "proton_profiler_dir": "/tmp/p"}"#,
        "profiler",
        "does not drive",
    );
    assert_err(
        r#"{"profiler": "nsys"}"#,
        "profiler",
        r#""torch", "cuda" or null"#,
    );
    assert_err(r#"{"profiler": 3}"#, "profiler", "not a number");
}

#[test]
fn torch_needs_a_dir_and_a_dir_needs_torch() {
    assert_err(
        r#"{"profiler": "torch"}"#,
        "torch_profiler_dir",
        "must be set",
    );
    assert_err(
        r#"{"profiler": "cuda", "torch_profiler_dir": "/tmp/x"}"#,
        "torch_profiler_dir",
        "only applicable when profiler is set to 'torch'",
    );
    assert_err(
        r#"{"torch_profiler_dir": "/tmp/x"}"#,
        "torch_profiler_dir",
        "only applicable",
    );
}

#[test]
fn activities_are_checked() {
    assert_err(
        r#"{"profiler": "cuda", "torch_profiler_activities": ["CPU"]}"#,
        "torch_profiler_activities",
        "only applicable",
    );
    let torch = r#""profiler": "torch", "torch_profiler_dir": "/tmp/x""#;
    assert_err(
        &format!(r#"{{{torch}, "torch_profiler_activities": []}}"#),
        "torch_profiler_activities",
        "must not be empty",
    );
    assert_err(
        &format!(r#"{{{torch}, "torch_profiler_activities": ["CPU", "CPU"]}}"#),
        "torch_profiler_activities",
        "duplicates",
    );
    assert_err(
        &format!(r#"{{{torch}, "torch_profiler_activities": ["GPU"]}}"#),
        "torch_profiler_activities",
        r#""CPU", "CUDA", "PrivateUse1" or "XPU""#,
    );
    assert_err(
        &format!(r#"{{{torch}, "torch_profiler_activities": "CPU"}}"#),
        "torch_profiler_activities",
        "must be a list",
    );
    let ok = ProfilerConfig::from_json_str(&format!(
        r#"{{{torch}, "torch_profiler_activities": null}}"#
    ))
    .unwrap();
    assert_eq!(ok.torch_profiler_activities, None);
}

#[test]
fn capture_torch_profiler_needs_torch() {
    assert_err(
        r#"{"profiler": "cuda", "capture_torch_profiler": true}"#,
        "capture_torch_profiler",
        "only applicable",
    );
}

#[test]
fn counts_must_be_non_negative_integers() {
    for field in [
        "delay_iterations",
        "max_iterations",
        "warmup_iterations",
        "wait_iterations",
    ] {
        assert_err(
            &format!(r#"{{"{field}": -1}}"#),
            field,
            "greater than or equal to 0",
        );
        assert_err(&format!(r#"{{"{field}": 1.5}}"#), field, "integer");
        assert_err(&format!(r#"{{"{field}": "3"}}"#), field, "not a string");
    }
    assert_err(
        r#"{"active_iterations": 0}"#,
        "active_iterations",
        "greater than or equal to 1",
    );
}

#[test]
fn booleans_must_be_booleans() {
    assert_err(
        r#"{"torch_profiler_use_gzip": "false"}"#,
        "torch_profiler_use_gzip",
        "true or false",
    );
    assert_err(
        r#"{"ignore_frontend": 1}"#,
        "ignore_frontend",
        "true or false",
    );
}

#[test]
fn unknown_keys_are_errors_naming_the_key() {
    assert_err(
        r#"{"max_iteration": 3}"#,
        "max_iteration",
        "not a profiler config key",
    );
    assert_err(
        r#"{"stepscope": {"nvtx_domian": "x"}}"#,
        "stepscope.nvtx_domian",
        "not a stepscope key",
    );
    assert_err(r#"{"stepscope": []}"#, "stepscope", "must be an object");
}

#[test]
fn proton_options_are_accepted_only_at_their_defaults() {
    assert_err(
        r#"{"proton_profiler_dir": "/tmp/p"}"#,
        "proton_profiler_dir",
        "only applicable when profiler is set to 'proton'",
    );
    assert_err(
        r#"{"proton_data": "trace"}"#,
        "proton_data",
        "does not drive Proton",
    );
}

#[test]
fn dirs_become_absolute_and_uris_stay() {
    let torch = |dir: &str| {
        ProfilerConfig::from_json_str(&format!(
            r#"{{"profiler": "torch", "torch_profiler_dir": "{dir}"}}"#
        ))
        .unwrap()
        .torch_profiler_dir
    };
    let cwd = std::env::current_dir().unwrap();
    assert_eq!(
        torch("traces/run1"),
        cwd.join("traces/run1").to_str().unwrap()
    );
    assert_eq!(torch("./a/../b"), cwd.join("b").to_str().unwrap());
    let home = std::env::var("HOME").unwrap();
    assert_eq!(
        torch("~/traces"),
        format!("{}/traces", home.trim_end_matches('/'))
    );
    assert_eq!(torch("s3://bucket/run"), "s3://bucket/run");
    assert_eq!(torch("hdfs://nn/x"), "hdfs://nn/x");
    // A one-letter scheme is a Windows drive, not a URI: made absolute like any path.
    assert!(torch("C://x").starts_with(cwd.to_str().unwrap()));
}

#[test]
fn malformed_json_names_its_source_and_position() {
    let e = err(r#"{"profiler": "cuda",}"#);
    assert!(matches!(e, Error::Json { .. }));
    assert!(e.to_string().contains("line 1 column"), "{e}");
    let e = err("[1, 2]");
    assert!(e.to_string().contains("expected a JSON object"), "{e}");
}

#[test]
fn config_comes_from_a_file() {
    let dir = stepscope_test_doubles::Scratch::empty("config");
    let good = dir.join("good.json");
    std::fs::write(&good, r#"{"profiler": "cuda", "max_iterations": 2}"#).unwrap();
    assert_eq!(ProfilerConfig::from_path(&good).unwrap().max_iterations, 2);

    let bad = dir.join("bad.json");
    std::fs::write(&bad, "{\n  \"profiler\": cuda\n}").unwrap();
    let e = ProfilerConfig::from_path(&bad).unwrap_err();
    let msg = e.to_string();
    assert!(msg.contains("bad.json") && msg.contains("line 2"), "{msg}");

    let missing = dir.join("missing.json");
    let e = ProfilerConfig::from_path(&missing).unwrap_err();
    assert!(matches!(e, Error::Io { .. }));
    assert!(e.to_string().contains("missing.json"), "{e}");
}

/// The only test in this binary that touches the environment.
#[test]
fn config_comes_from_stepscope_config() {
    std::env::remove_var("STEPSCOPE_CONFIG");
    assert_eq!(ProfilerConfig::from_env().unwrap(), None);

    std::env::set_var("STEPSCOPE_CONFIG", r#"{"delay_iterations": 7}"#);
    assert_eq!(
        ProfilerConfig::from_env()
            .unwrap()
            .unwrap()
            .delay_iterations,
        7
    );

    let path = std::env::temp_dir().join(format!("stepscope-env-{}.json", std::process::id()));
    std::fs::write(&path, r#"{"max_iterations": 9}"#).unwrap();
    std::env::set_var("STEPSCOPE_CONFIG", &path);
    assert_eq!(
        ProfilerConfig::from_env().unwrap().unwrap().max_iterations,
        9
    );

    std::env::set_var("STEPSCOPE_CONFIG", r#"{"delay_iterations": -2}"#);
    let e = ProfilerConfig::from_env().unwrap_err();
    assert_eq!(e.field(), Some("delay_iterations"));

    std::env::set_var("STEPSCOPE_CONFIG", "{oops");
    let e = ProfilerConfig::from_env().unwrap_err();
    assert!(e.to_string().contains("STEPSCOPE_CONFIG"), "{e}");
    std::env::remove_var("STEPSCOPE_CONFIG");
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn stepscope_keys_are_checked() {
    use stepscope::config::NvtxMode;
    let c = ProfilerConfig::from_json_str(
        r#"{"stepscope": {"nvtx": "always", "nvtx_domain": "engine", "cuda_device": 3}}"#,
    )
    .unwrap();
    assert_eq!(c.stepscope.nvtx, NvtxMode::Always);
    assert_eq!(c.stepscope.nvtx_domain, "engine");
    assert_eq!(c.stepscope.cuda_device, Some(3));
    let d = ProfilerConfig::from_json_str("{}").unwrap();
    assert_eq!(d.stepscope.nvtx, NvtxMode::Running);
    assert_eq!(d.stepscope.nvtx_domain, "stepscope");
    assert_eq!(d.stepscope.cuda_device, None);

    assert_err(
        r#"{"stepscope": {"nvtx": "on"}}"#,
        "stepscope.nvtx",
        r#""running", "always" or "off""#,
    );
    assert_err(
        r#"{"stepscope": {"nvtx_domain": ""}}"#,
        "stepscope.nvtx_domain",
        "non-empty ASCII",
    );
    assert_err(
        r#"{"stepscope": {"nvtx_domain": 7}}"#,
        "stepscope.nvtx_domain",
        "must be a string",
    );
    assert_err(
        r#"{"stepscope": {"cuda_device": -1}}"#,
        "stepscope.cuda_device",
        "device ordinal",
    );
}

#[test]
fn gzip_level_is_an_integer_from_1_to_9() {
    use stepscope::config::{GZIP_LEVEL, GZIP_LEVELS};
    let d = ProfilerConfig::from_json_str("{}").unwrap();
    assert_eq!(d.stepscope.gzip_level, GZIP_LEVEL);
    assert!(GZIP_LEVELS.contains(&GZIP_LEVEL));
    for level in [1, 9] {
        let c = ProfilerConfig::from_json_str(&format!(
            r#"{{"stepscope": {{"gzip_level": {level}}}}}"#
        ))
        .unwrap();
        assert_eq!(c.stepscope.gzip_level, level);
    }
    for bad in ["0", "10", "-1", "1.5", "\"6\"", "true"] {
        assert_err(
            &format!(r#"{{"stepscope": {{"gzip_level": {bad}}}}}"#),
            "stepscope.gzip_level",
            "an integer from 1 to 9",
        );
    }
}

#[test]
fn serializer_is_stepscope_kineto_or_compare() {
    use stepscope::config::Serializer;
    let d = ProfilerConfig::from_json_str("{}").unwrap();
    assert_eq!(d.stepscope.serializer, Serializer::Stepscope);
    for (text, want) in [
        ("stepscope", Serializer::Stepscope),
        ("kineto", Serializer::Kineto),
        ("compare", Serializer::Compare),
    ] {
        let c = ProfilerConfig::from_json_str(&format!(
            r#"{{"stepscope": {{"serializer": "{text}"}}}}"#
        ))
        .unwrap();
        assert_eq!(c.stepscope.serializer, want);
    }
    for bad in ["\"fast\"", "\"Kineto\"", "1", "null"] {
        assert_err(
            &format!(r#"{{"stepscope": {{"serializer": {bad}}}}}"#),
            "stepscope.serializer",
            "must be \"stepscope\", \"kineto\" or \"compare\"",
        );
    }
}

#[test]
fn otel_takes_true_false_or_its_fields_needs_the_request_log_and_names_a_bad_field() {
    use stepscope::config::{OtelExport, OTEL_BATCH, OTEL_COSTLIEST, OTEL_QUEUE};
    let on = |otel: &str| {
        ProfilerConfig::from_json_str(&format!(
            r#"{{"stepscope": {{"requests": true, "otel": {otel}}}}}"#
        ))
        .unwrap()
        .stepscope
        .otel
    };
    assert_eq!(on("false"), None);
    assert_eq!(on("null"), None);
    let d = on("true").unwrap();
    assert_eq!(
        (
            d.endpoint.as_deref(),
            d.steps,
            d.queue,
            d.batch,
            d.costliest
        ),
        (None, false, OTEL_QUEUE, OTEL_BATCH, OTEL_COSTLIEST)
    );
    assert_eq!(
        on(
            r#"{"endpoint": "http://127.0.0.1:4318/v1/traces", "steps": true, "queue": 4, "batch": 1}"#
        ),
        Some(OtelExport {
            endpoint: Some("http://127.0.0.1:4318/v1/traces".into()),
            steps: true,
            queue: 4,
            batch: 1,
            costliest: OTEL_COSTLIEST,
        })
    );
    assert_err(
        r#"{"stepscope": {"otel": true}}"#,
        "stepscope.otel",
        "needs the request log",
    );
    for (otel, field, text) in [
        ("3", "stepscope.otel", "must be true, false"),
        (r#"{"queue": 0}"#, "stepscope.otel.queue", "from 1 to"),
        (r#"{"batch": "8"}"#, "stepscope.otel.batch", "from 1 to"),
        (r#"{"steps": 1}"#, "stepscope.otel.steps", "true or false"),
        (r#"{"endpoint": 4317}"#, "stepscope.otel.endpoint", "a URL"),
        (
            r#"{"endpiont": "x"}"#,
            "stepscope.otel.endpiont",
            "not an OpenTelemetry",
        ),
    ] {
        assert_err(
            &format!(r#"{{"stepscope": {{"requests": true, "otel": {otel}}}}}"#),
            field,
            text,
        );
    }
}
