//! The driver's answers to the questions vramshim's pool and capture handling rest on
//! (`tests/workloads/sim/driver_facts.c`: mapping at an offset into a handle, one handle at two
//! addresses, access over several mappings, partial unmaps, stream-ordered frees during a
//! capture, streams that join a capture), asked of the simulated driver and compared with the
//! answers written down in `tests/workloads/sim/driver_facts.expected`. `scripts/gpu-smoke.sh`
//! asks a real driver the same questions and compares with the same file, so a simulator that
//! answers otherwise than the hardware is found there instead of trusted here.

use vramshim_testkit::{Link, compile_c, repo_root, run, sim_command};

/// The `fact NAME=VALUE` lines of `text`, in order (anything else is commentary).
fn facts(text: &str) -> Vec<(String, String)> {
    text.lines()
        .filter_map(|l| l.strip_prefix("fact "))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect()
}

#[test]
fn facts_reads_only_fact_lines() {
    let text = "# map_offset=9 is a comment\nfact a=1\nnoise b=2\nfact c = -1\n";
    assert_eq!(
        facts(text),
        [
            ("a".to_string(), "1".to_string()),
            ("c".into(), "-1".into())
        ]
    );
}

#[test]
fn the_simulated_driver_answers_as_written_down() {
    let exe = compile_c(
        "driver_facts",
        &["tests/workloads/sim/driver_facts.c"],
        Link::Dl,
    );
    let out = run(&mut sim_command(&exe, "driver_facts"));
    out.assert_success();
    assert!(out.stdout.contains("driver_facts: done"), "{}", out.stdout);
    let path = repo_root().join("tests/workloads/sim/driver_facts.expected");
    let expected =
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let (got, want) = (facts(&out.stdout), facts(&expected));
    assert!(!want.is_empty(), "{} holds no fact line", path.display());
    let differ: Vec<String> = want
        .iter()
        .map(|(k, v)| (k, v, got.iter().find(|(g, _)| g == k).map(|(_, x)| x)))
        .filter(|(_, v, x)| *x != Some(*v))
        .map(|(k, v, x)| format!("{k}: the simulator answers {x:?}, written down {v}"))
        .chain(
            got.iter()
                .filter(|(k, _)| !want.iter().any(|(w, _)| w == k))
                .map(|(k, x)| format!("{k}: the simulator answers {x}, not written down")),
        )
        .collect();
    assert!(
        differ.is_empty(),
        "{}:\n{}",
        path.display(),
        differ.join("\n")
    );
}
