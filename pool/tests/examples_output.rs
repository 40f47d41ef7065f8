//! The examples' output is often read by another program (`pool_slack ... | head`): when that
//! reader goes away before the example is done, the example ends quietly (status 0), never
//! with a panic's message. `cargo test -p vramshim-pool` builds the examples next to this
//! test (a run of this test alone, `--test examples_output`, does not: build them first).

use std::path::PathBuf;
use std::process::{Command, Stdio};

/// Where Cargo put the example `name` of this profile.
fn example(name: &str) -> PathBuf {
    let me = std::env::current_exe().expect("the test's own path");
    let profile = me
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target/<profile>/deps");
    profile.join("examples").join(name)
}

#[test]
fn an_example_whose_reader_leaves_ends_quietly() {
    let trace = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/workloads/traces/vit_train.rmm.csv"
    );
    for (name, args) in [
        ("pool_slack", vec!["0.05:2", "--", trace]),
        ("pool_traces", vec![trace]),
        ("pool_passes", vec![trace]),
        ("pool_peak", vec![trace]),
        ("pool_smallpages", vec![trace]),
        ("pool_handles", vec![trace]),
    ] {
        let exe = example(name);
        assert!(
            exe.exists(),
            "{} is not built: cargo build --release -p vramshim-pool --examples",
            exe.display()
        );
        let mut child = Command::new(&exe)
            .args(&args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // the reader goes away before the example writes its first line
        drop(child.stdout.take());
        let out = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!err.contains("panicked"), "{name}: no panic: {err}");
        assert_eq!(
            out.status.code(),
            Some(0),
            "{name}: {:?}: {err}",
            out.status
        );
    }
}
