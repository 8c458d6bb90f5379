// Binaries linking libtorch find it without LD_LIBRARY_PATH: stepscope publishes the libtorch
// directory it was built against (DEP_STEPSCOPE_LIBTORCH_LIB), and we put it in the rpath.
// Any engine using stepscope's torch feature can do the same.
fn main() {
    println!("cargo:rerun-if-env-changed=DEP_STEPSCOPE_LIBTORCH_LIB");
    if let Ok(lib) = std::env::var("DEP_STEPSCOPE_LIBTORCH_LIB") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{lib}");
    }
}
