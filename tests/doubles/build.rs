//! Compiles the C test doubles into shared libraries under OUT_DIR:
//! - `cuda/libcuda.so` (+ `libcuda.so.1`): a stub NVIDIA driver, found through
//!   LD_LIBRARY_PATH like the real one;
//! - `libnvtx_recorder.so`: an NVTX injection library, loaded through NVTX_INJECTION64_PATH
//!   exactly as Nsight Systems' is.
use std::path::{Path, PathBuf};

fn shared_lib(src: &Path, out: &Path, extra: &[&str]) {
    let compiler = cc::Build::new().get_compiler();
    let mut cmd = compiler.to_command();
    cmd.args([
        "-shared", "-fPIC", "-O2", "-Wall", "-Wextra", "-Werror", "-std=c11",
    ])
    .args(extra)
    .arg("-o")
    .arg(out)
    .arg(src)
    .arg("-lpthread");
    let status = cmd
        .status()
        .unwrap_or_else(|e| panic!("cannot run the C compiler: {e}"));
    assert!(status.success(), "compiling {} failed", src.display());
}

fn main() {
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("OUT_DIR"));
    let cuda_dir = out.join("cuda");
    std::fs::create_dir_all(&cuda_dir).expect("create cuda dir");
    let stub = cuda_dir.join("libcuda.so");
    shared_lib(
        Path::new("c/cuda_stub.c"),
        &stub,
        &["-Wl,-soname,libcuda.so.1"],
    );
    let so1 = cuda_dir.join("libcuda.so.1");
    let _ = std::fs::remove_file(&so1);
    std::fs::copy(&stub, &so1).expect("copy libcuda.so.1");
    shared_lib(
        Path::new("c/nvtx_recorder.c"),
        &out.join("libnvtx_recorder.so"),
        &[],
    );
    for f in [
        "c/cuda_stub.c",
        "c/nvtx_recorder.c",
        "c/doubles_log.h",
        "build.rs",
    ] {
        println!("cargo:rerun-if-changed={f}");
    }
    println!("cargo:rerun-if-env-changed=CC");
    println!("cargo:rerun-if-env-changed=CFLAGS");
}
