// The extension links no libtorch (the torch backend loads its Kineto glue at run time). What
// this does: build the glue for the torch of the Python the extension is built for, into the
// package (python/stepscope/_glue/), with the glue's sources beside it (so `python -m
// stepscope.glue build` works from an installed wheel). That makes a source build (`pip install
// --no-build-isolation stepscope-*.tar.gz`) serve whatever torch is installed. Glue for other
// torch versions is built by running python/stepscope/glue.py with their Pythons (the Makefile
// does for the second environment). STEPSCOPE_BUILD_GLUE=0 skips it; a Python without torch
// skips it with a warning.
use std::env;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

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
    let out = root.join("python/stepscope/_glue");
    for f in ["kineto.cc", "stepscope_kineto.h"] {
        println!("cargo:rerun-if-changed={}", src.join(f).display());
    }
    println!("cargo:rerun-if-changed={}", out.display());
    if env::var("STEPSCOPE_BUILD_GLUE").is_ok_and(|v| v == "0") {
        return;
    }
    if let Err(e) = copy_sources(&src, &out.join("src")) {
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
    let script = root.join("python/stepscope/glue.py");
    let status = Command::new(&python)
        .arg(&script)
        .args(["build", "--src"])
        .arg(&src)
        .arg("--out")
        .arg(&out)
        .status();
    match status {
        Ok(s) if s.success() => {}
        Ok(s) => println!(
            "cargo:warning=stepscope: building the Kineto glue with {python} failed ({s}); the \
             torch backend needs one built with `python -m stepscope.glue build`"
        ),
        Err(e) => println!("cargo:warning=stepscope: running {python}: {e}"),
    }
}

fn copy_sources(src: &Path, dst: &Path) -> std::io::Result<()> {
    fs::create_dir_all(dst)?;
    for f in ["kineto.cc", "stepscope_kineto.h"] {
        let (from, to) = (src.join(f), dst.join(f));
        if fs::read(&from)? != fs::read(&to).unwrap_or_default() {
            fs::copy(&from, &to)?;
        }
    }
    Ok(())
}
