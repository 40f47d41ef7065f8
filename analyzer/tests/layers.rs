//! The analyzer library's modules import only downward (`vramshim_testkit::layers`): the
//! event sources and symbolization under the format readers, the readers under the opening
//! by format, that under the analysis, and the renderers and converters on top. The
//! subcommands (`src/cmd/`, `src/main.rs`) are the binary's, over the library.

use std::path::Path;

/// Bottom first; the modules of one entry import none of each other.
const LAYERS: &[&[&str]] = &[
    &["terminal"],
    &["error", "units", "progress", "fastmap", "json", "switches"],
    &["files", "source", "symbols"],
    &["formats"],
    &["input"],
    &["analysis"],
    &["render", "whatif", "convert", "synth"],
];

#[test]
fn every_module_imports_only_downward() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let (found, read) = vramshim_testkit::layers::check(&src, LAYERS, &["main.rs", "cmd"]);
    assert!(read >= 30, "the scan read only {read} files");
    assert!(
        found.is_empty(),
        "imports against the layer order {LAYERS:?}:\n{}",
        found.join("\n")
    );
}
