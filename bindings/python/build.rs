// The extension links libtorch (the `torch` feature). Installed from a wheel it sits in
// site-packages/stepscope/, next to site-packages/torch/lib: `$ORIGIN/../torch/lib` finds that
// libtorch without LD_LIBRARY_PATH. The package also imports torch before the extension, so the
// libraries are already loaded (by soname) wherever the extension lives.
fn main() {
    println!("cargo:rustc-link-arg=-Wl,-rpath,$ORIGIN/../torch/lib");
}
