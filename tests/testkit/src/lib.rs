//! Test support shared by every crate's integration tests.

use std::path::PathBuf;

/// `target/<profile>` of the running test binary, whatever `CARGO_TARGET_DIR` is.
pub fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    // target/<profile>/deps/<test-binary>
    let deps = exe.parent().expect("deps dir");
    deps.parent().expect("profile dir").to_path_buf()
}

/// The repository root.
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("repo root")
}

/// Path of the built `libvramshim.so`.
pub fn interposer_lib() -> PathBuf {
    profile_dir().join("libvramshim.so")
}
