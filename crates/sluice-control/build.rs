//! Generates the gRPC code from proto/control.proto (needs `protoc`, from
//! Debian's protobuf-compiler; scripts/install-build-deps.sh installs it).
fn main() {
    println!("cargo:rerun-if-changed=proto/control.proto");
    if let Err(e) =
        tonic_prost_build::configure().compile_protos(&["proto/control.proto"], &["proto"])
    {
        eprintln!("compiling proto/control.proto failed: {e}");
        eprintln!("protoc is needed: run scripts/install-build-deps.sh (apt-get install protobuf-compiler)");
        std::process::exit(1);
    }
}
