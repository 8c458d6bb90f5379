// The default build compiles no foreign code. The `torch` feature (see cpp/) adds the cxx
// bridge to libtorch's Kineto profiler here; keep every input it reads declared below so
// cargo rebuilds exactly when they change.
fn main() {
    println!("cargo:rerun-if-changed=build.rs");
}
