//! Embeds the reference page's renderer (`reference/redoc.standalone.js`, installed from the
//! npm registry by `scripts/reference.sh`), or nothing when it is not installed: the page
//! then says how to install it.

use std::path::PathBuf;

fn main() -> std::io::Result<()> {
    let folder = |name: &str| {
        std::env::var_os(name)
            .map(PathBuf::from)
            .ok_or_else(|| std::io::Error::other(format!("cargo did not set {name}")))
    };
    let (manifest, out) = (folder("CARGO_MANIFEST_DIR")?, folder("OUT_DIR")?);
    let reference = manifest.join("reference");
    // The folder is in the repository; a bundle installed or replaced in it changes it.
    println!("cargo:rerun-if-changed={}", reference.display());
    for name in ["redoc.standalone.js", "redoc.standalone.js.LICENSE.txt", "redoc.version"] {
        let bytes = std::fs::read(reference.join(name)).unwrap_or_default();
        std::fs::write(out.join(name), bytes)?;
    }
    Ok(())
}
