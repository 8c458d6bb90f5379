// The default build compiles no foreign code. The `torch` feature compiles cpp/ (the Kineto
// glue, a C ABI over libtorch's profiler) against the libtorch that torch-sys found and links;
// every input it reads is declared below so cargo rebuilds exactly when one changes.
fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    #[cfg(feature = "torch")]
    torch::build();
}

#[cfg(feature = "torch")]
mod torch {
    use std::env;
    use std::path::{Path, PathBuf};
    use std::process::Command;

    fn var(name: &str) -> Option<String> {
        println!("cargo:rerun-if-env-changed={name}");
        env::var(name).ok()
    }

    /// torch-sys's choice of `_GLIBCXX_USE_CXX11_ABI`, made the same way: ask the Python
    /// environment's torch when LIBTORCH_USE_PYTORCH is set, else LIBTORCH_CXX11_ABI
    /// (default 1). Mixing ABIs links but corrupts every std::string crossing the boundary.
    fn cxx11_abi() -> String {
        if var("LIBTORCH_USE_PYTORCH").is_some() {
            let python = if var("VIRTUAL_ENV").is_some() {
                "python"
            } else {
                "python3"
            };
            let out = Command::new(python)
                .args([
                    "-c",
                    "import torch; print(int(torch._C._GLIBCXX_USE_CXX11_ABI))",
                ])
                .output()
                .unwrap_or_else(|e| {
                    panic!("stepscope: running {python} to read torch's C++ ABI: {e}")
                });
            let text = String::from_utf8_lossy(&out.stdout);
            match text.trim() {
                abi @ ("0" | "1") => abi.to_string(),
                _ => panic!(
                    "stepscope: {python} did not report torch's C++ ABI (stdout {text:?}, stderr {:?})",
                    String::from_utf8_lossy(&out.stderr)
                ),
            }
        } else {
            var("LIBTORCH_CXX11_ABI").unwrap_or_else(|| "1".into())
        }
    }

    pub fn build() {
        let lib = var("DEP_TCH_LIBTORCH_LIB").expect(
            "stepscope: torch-sys did not report its libtorch directory (DEP_TCH_LIBTORCH_LIB)",
        );
        let lib = PathBuf::from(lib);
        let root = lib.parent().unwrap_or(Path::new("/")).to_path_buf();
        let includes = [
            root.join("include"),
            root.join("include/torch/csrc/api/include"),
            root.join("include/kineto"),
        ];
        for dir in &includes {
            if !dir.is_dir() {
                panic!(
                    "stepscope: libtorch include directory {} is missing",
                    dir.display()
                );
            }
        }
        let abi = cxx11_abi();
        let mut build = cc::Build::new();
        build
            .cpp(true)
            .file("cpp/kineto.cc")
            .std("c++20")
            .define("_GLIBCXX_USE_CXX11_ABI", abi.as_str());
        build.define("GLOG_USE_GLOG_EXPORT", None);
        // libtorch's headers as system headers: their warnings are not ours.
        for dir in &includes {
            build
                .flag("-isystem")
                .flag(dir.to_str().expect("libtorch path is not UTF-8"));
        }
        build
            .flag_if_supported("-Wall")
            .flag_if_supported("-Wextra");
        build.compile("stepscope_kineto");
        for f in [
            "cpp/stepscope_kineto.h",
            "cpp/kineto.cc",
            "cpp/kineto_writer.h",
        ] {
            println!("cargo:rerun-if-changed={f}");
        }
        // Binaries of this package (tests, examples, the cdylib) find libtorch without
        // LD_LIBRARY_PATH; dependents get the directory to do the same (see README).
        println!("cargo:rustc-link-arg=-Wl,-rpath,{}", lib.display());
        println!("cargo:libtorch_lib={}", lib.display());
    }
}
