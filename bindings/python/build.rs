// The extension links no libtorch (the torch backend loads its Kineto glue at run time).
//
// In a checkout this script builds nothing: `make glue` builds the glue for each torch
// environment under target/glue/ and stages it in the package (python/stepscope/_glue/) for
// the wheel. Built from a source distribution (PKG-INFO at its root: `pip install
// --no-build-isolation stepscope-*.tar.gz`), it builds the glue for the torch of the Python it
// is built for into OUT_DIR, and stages it with its C++ sources in that unpacked sdist's
// package, so the wheel pip makes serves whatever torch is installed (and `python -m
// stepscope.glue build` works from it). STEPSCOPE_BUILD_GLUE=0 skips it; a Python without
// torch skips it with a warning.
use std::env;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

// The same list as python/stepscope/glue.py's SOURCES.
const SOURCES: [&str; 3] = ["kineto.cc", "kineto_writer.h", "stepscope_kineto.h"];

fn main() {
    for var in [
        "PYO3_PYTHON",
        "PYTHON_SYS_EXECUTABLE",
        "STEPSCOPE_BUILD_GLUE",
        "CXX",
    ] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    let root = manifest.join("../..");
    let src = root.join("cpp");
    for f in SOURCES {
        println!("cargo:rerun-if-changed={}", src.join(f).display());
    }
    if !root.join("PKG-INFO").is_file() || env::var("STEPSCOPE_BUILD_GLUE").is_ok_and(|v| v == "0")
    {
        return;
    }
    let built = PathBuf::from(env::var("OUT_DIR").expect("cargo sets it")).join("glue");
    let package = root.join("python/stepscope/_glue");
    if let Err(e) = copy_files(&src, &package.join("src"), &SOURCES) {
        println!("cargo:warning=stepscope: copying the Kineto glue's sources: {e}");
    }
    let python = env::var("PYO3_PYTHON")
        .or_else(|_| env::var("PYTHON_SYS_EXECUTABLE"))
        .unwrap_or_else(|_| "python3".into());
    let has_torch = Command::new(&python)
        .args(["-c", "import torch"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !has_torch {
        println!(
            "cargo:warning=stepscope: {python} has no torch: no Kineto glue built (the torch \
             backend then needs one built with `python -m stepscope.glue build`)"
        );
        return;
    }
    let status = Command::new(&python)
        .arg(root.join("python/stepscope/glue.py"))
        .args(["build", "--src"])
        .arg(&src)
        .arg("--out")
        .arg(&built)
        .status();
    match status {
        Ok(s) if s.success() => {}
        Ok(s) => {
            println!(
                "cargo:warning=stepscope: building the Kineto glue with {python} failed ({s}); \
                 the torch backend needs one built with `python -m stepscope.glue build`"
            );
            return;
        }
        Err(e) => {
            println!("cargo:warning=stepscope: running {python}: {e}");
            return;
        }
    }
    let names: Vec<String> = fs::read_dir(&built)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("libstepscope_kineto-torch") && n.ends_with(".so"))
        .collect();
    if let Err(e) = copy_files(&built, &package, &names) {
        println!("cargo:warning=stepscope: staging the Kineto glue in the package: {e}");
    }
}

/// Copies the files `names` from `from` into `to` (made if missing), each only when it differs.
fn copy_files(from: &Path, to: &Path, names: &[impl AsRef<str>]) -> std::io::Result<()> {
    fs::create_dir_all(to)?;
    for name in names {
        let (a, b) = (from.join(name.as_ref()), to.join(name.as_ref()));
        if fs::read(&a)? != fs::read(&b).unwrap_or_default() {
            fs::copy(&a, &b)?;
        }
    }
    Ok(())
}
