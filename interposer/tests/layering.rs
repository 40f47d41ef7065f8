//! The interposer's layers import only downward (`vramshim_testkit::layers`). Each module of
//! `src/` belongs to the layer named by the first component of its path; every `crate::`
//! path in its code must name its own layer or one below it. Layers side by side (`cap`,
//! `pool`, `tracer`, `state`) import none of each other: `lifecycle` wires what they read of
//! each other.

use std::path::Path;

use vramshim_testkit::layers;

/// The layers, bottom first; those in one entry stand side by side.
const LAYERS: &[&[&str]] = &[
    &["config"],
    &["sys"],
    &["cuda"],
    &["cap", "pool", "tracer", "state"],
    &["pipeline"],
    &["hooks"],
    &["lifecycle"],
];

/// The log's macros are invoked as `crate::warn!` & co. but live in `sys::log`.
const MACROS: &[(&str, &str)] = &[("warn", "sys"), ("info", "sys"), ("debug", "sys")];

#[test]
fn every_module_imports_only_downward() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let (found, read) = layers::check_with_aliases(&src, LAYERS, MACROS, &[]);
    assert!(read > 30, "the scan read only {read} files");
    assert!(
        found.is_empty(),
        "imports against the layer order {LAYERS:?}:\n{}",
        found.join("\n")
    );
}

/// The checker sees each form of import the interposer writes, with its layers and macros.
#[test]
fn the_checker_sees_every_form_of_upward_import() {
    let v = |layer, code| layers::violations(LAYERS, MACROS, layer, code);
    assert_eq!(
        v("cuda", "use crate::hooks::is_our_hook;"),
        ["cuda -> hooks"]
    );
    assert_eq!(
        v("sys", "use crate::{config, pipeline};"),
        ["sys -> pipeline"]
    );
    assert_eq!(
        v(
            "sys",
            "use crate::{\n    config::var,\n    pipeline::{run, Outcome},\n};"
        ),
        ["sys -> pipeline"]
    );
    assert_eq!(
        v("cap", "    let x = crate::pool::stats(0);"),
        ["cap -> pool"]
    );
    assert_eq!(
        v("config", "        crate::warn!(\"x\");"),
        ["config -> sys"]
    );
    assert_eq!(
        v("sys", "        $crate::pipeline::x();"),
        ["sys -> pipeline"]
    );
    assert!(v("hooks", "use crate::pipeline; use crate::cuda::real;").is_empty());
    assert!(v("cap", "crate::warn!(\"x\"); use crate::cuda::driver;").is_empty());
    assert!(v("cuda", "// see crate::hooks for why").is_empty());
    assert!(v("cuda", "use vramshim_crate::hooks;").is_empty());
}
