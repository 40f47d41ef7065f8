include!("../runtime/build_support.rs");

fn main() {
    build_artifact(None, false);
}
