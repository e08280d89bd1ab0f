//! Embeds the reference page's renderer (`reference/redoc.standalone.js`, installed from the
//! npm registry by `scripts/reference.sh`), or nothing when it is not installed: the page
//! then says how to install it.

use std::path::PathBuf;

fn main() {
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let reference = manifest.join("reference");
    // The folder is in the repository; a bundle installed or replaced in it changes it.
    println!("cargo:rerun-if-changed={}", reference.display());
    for name in ["redoc.standalone.js", "redoc.standalone.js.LICENSE.txt", "redoc.version"] {
        let bytes = std::fs::read(reference.join(name)).unwrap_or_default();
        std::fs::write(out.join(name), bytes).expect("writing into OUT_DIR");
    }
}
