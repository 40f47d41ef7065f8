include!("../runtime/build_support.rs");

fn main() {
    build_artifact(Some("libcudart.so.13"), true);
}
