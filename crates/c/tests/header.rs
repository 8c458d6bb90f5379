//! include/stepscope.h is what cbindgen generates from this crate's declarations, byte for
//! byte: a declaration changed without `make header` fails here. `STEPSCOPE_BLESS_HEADER=1`
//! rewrites the header instead (what `make header` runs).

use std::path::Path;

const CRATE: &str = env!("CARGO_MANIFEST_DIR");

fn generated() -> String {
    let config = cbindgen::Config::from_file(format!("{CRATE}/cbindgen.toml"))
        .expect("read crates/c/cbindgen.toml");
    let bindings = cbindgen::Builder::new()
        .with_crate(CRATE)
        .with_config(config)
        .generate()
        .expect("cbindgen generates the header");
    let mut out = Vec::new();
    bindings.write(&mut out);
    String::from_utf8(out).expect("the header is UTF-8")
}

#[test]
fn the_header_is_generated_from_the_declarations() {
    let path = Path::new(CRATE).join("../../include/stepscope.h");
    let want = generated();
    if std::env::var_os("STEPSCOPE_BLESS_HEADER").is_some() {
        std::fs::write(&path, &want).expect("write include/stepscope.h");
        return;
    }
    let have = std::fs::read_to_string(&path).expect("read include/stepscope.h");
    if have != want {
        let line = have
            .lines()
            .zip(want.lines())
            .position(|(a, b)| a != b)
            .unwrap_or_else(|| have.lines().count().min(want.lines().count()));
        panic!(
            "include/stepscope.h differs from what cbindgen generates from crates/c/src/lib.rs \
             (first at line {}): run `make header` and commit the result",
            line + 1
        );
    }
}
