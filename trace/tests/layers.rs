//! The trace crate's modules import only downward (`vramshim_testkit::layers`): the wire
//! primitives under both the record codec and the columnar timing streams, the writer under
//! the reader (which reads the frame layout the writer defines).

use std::path::Path;

/// Bottom first; the modules of one entry import none of each other.
const LAYERS: &[&[&str]] = &[
    &["event", "wire", "footprint", "switches"],
    &["columns", "torch_run"],
    &["codec", "header"],
    &["writer", "output_file"],
    &["reader"],
];

#[test]
fn every_module_imports_only_downward() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let (found, read) = vramshim_testkit::layers::check(&src, LAYERS, &[]);
    assert!(read >= 9, "the scan read only {read} files");
    assert!(
        found.is_empty(),
        "imports against the layer order {LAYERS:?}:\n{}",
        found.join("\n")
    );
}
