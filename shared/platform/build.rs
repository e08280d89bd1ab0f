//! The migrations are embedded (refinery): a new file must rebuild the crate.
fn main() {
    println!("cargo:rerun-if-changed=migrations");
}
