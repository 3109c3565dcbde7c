//! Compiles our minimal `.proto` schemas with protox (pure Rust, no `protoc`) and prost-build.

fn main() {
    let protos = ["proto/xplane.proto", "proto/hlo.proto"];
    for p in protos {
        println!("cargo:rerun-if-changed={p}");
    }
    let fds = match protox::compile(protos, ["proto"]) {
        Ok(fds) => fds,
        Err(e) => panic!("protox could not compile proto/: {e}"),
    };
    if let Err(e) = prost_build::Config::new().compile_fds(fds) {
        panic!("prost-build failed: {e}");
    }
}
