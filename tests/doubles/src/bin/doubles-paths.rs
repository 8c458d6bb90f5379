//! Prints where the test doubles were built, for tests outside cargo (pytest):
//! `{"cuda_stub_dir": ..., "nvtx_recorder": ..., "log_env": ...}`.
fn main() {
    println!(
        "{{\"cuda_stub_dir\": {:?}, \"nvtx_recorder\": {:?}, \"log_env\": {:?}}}",
        stepscope_test_doubles::CUDA_STUB_DIR,
        stepscope_test_doubles::NVTX_RECORDER,
        stepscope_test_doubles::LOG_ENV
    );
}
