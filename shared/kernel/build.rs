//! Compiles the log event schemas in pure Rust (protox), so no system `protoc` is needed.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = "../../schemas";
    let files = [
        "platform/events/v1/authoring.proto",
        "platform/events/v1/records.proto",
        "platform/events/v1/suppressions.proto",
        "platform/events/v1/events.proto",
        "platform/events/v1/webhooks.proto",
        "platform/events/v1/email.proto",
        "platform/events/v1/segments.proto",
        "platform/events/v1/broadcasts.proto",
        "platform/events/v1/workflows.proto",
        "platform/events/v1/ingest.proto",
    ];
    for file in files {
        println!("cargo:rerun-if-changed={root}/{file}");
    }
    let descriptors = protox::compile(files, [root])?;
    // The descriptors themselves too, so a tool can show any event by its fields' names
    // (`proto::FILE_DESCRIPTOR_SET`).
    let out_dir = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(out_dir.join("events.descriptors"), protox::prost::Message::encode_to_vec(&descriptors))?;
    prost_build::Config::new().compile_fds(descriptors)?;
    Ok(())
}
