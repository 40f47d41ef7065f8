//! The simulated `libcudart.so.13` / `.so.12` define every runtime function PyTorch's CUDA
//! libraries import: the checked-in list always, and the installed wheel's actual imports when
//! PyTorch is installed (so a newer PyTorch importing something new is caught).

use std::collections::BTreeSet;

use vramshim_pytorch_tests::{
    dynamic_symbols, runtime_imports, sim_runtime_defines, torch_lib_dir, torch_or_skip,
};

#[test]
fn the_list_has_the_113_functions_of_pytorch_2_15() {
    let l = runtime_imports();
    assert_eq!(l.len(), 113, "runtime-imports.txt");
    let unique: BTreeSet<_> = l.iter().collect();
    assert_eq!(unique.len(), l.len(), "duplicates in runtime-imports.txt");
    for f in [
        "cudaMalloc",
        "cudaLaunchKernel",
        "__cudaRegisterFatBinary",
        "cudaGetDriverEntryPointByVersion",
    ] {
        assert!(l.iter().any(|x| x == f), "{f} missing from the list");
    }
}

#[test]
fn simulated_runtimes_define_every_listed_import() {
    for n in [13, 12] {
        let defined = sim_runtime_defines(n);
        let missing: Vec<_> = runtime_imports()
            .into_iter()
            .filter(|f| !defined.contains(f))
            .collect();
        assert!(
            missing.is_empty(),
            "libcudart.so.{n} of cuda-sim lacks {} of PyTorch's imports: {missing:?}",
            missing.len()
        );
    }
}

#[test]
fn simulated_runtime_defines_every_import_of_the_installed_pytorch() {
    let Some(py) = torch_or_skip("simulated_runtime_defines_every_import_of_the_installed_pytorch")
    else {
        return;
    };
    let lib_dir = torch_lib_dir(&py);
    let defined = sim_runtime_defines(13);
    let listed: BTreeSet<String> = runtime_imports().into_iter().collect();
    let mut imported = BTreeSet::new();
    let mut libs = 0;
    for entry in std::fs::read_dir(&lib_dir).expect("torch/lib") {
        let p = entry.expect("dir entry").path();
        if !p
            .file_name()
            .is_some_and(|n| n.to_string_lossy().contains(".so"))
        {
            continue;
        }
        libs += 1;
        for (name, version) in dynamic_symbols(&p, false) {
            if version.as_deref() == Some("libcudart.so.13") {
                imported.insert(name);
            }
        }
    }
    assert!(libs >= 5, "only {libs} libraries in {}", lib_dir.display());
    assert!(
        imported.len() >= 100,
        "only {} runtime imports found",
        imported.len()
    );
    let missing: Vec<_> = imported.iter().filter(|f| !defined.contains(*f)).collect();
    assert!(
        missing.is_empty(),
        "the installed PyTorch imports {} runtime functions cuda-sim's libcudart.so.13 lacks: {missing:?}\n\
         (add them to tests/cuda-sim/runtime/src/exports.rs and tests/workloads/pytorch/runtime-imports.txt)",
        missing.len()
    );
    let unlisted: Vec<_> = imported.difference(&listed).collect();
    assert!(
        unlisted.is_empty(),
        "runtime-imports.txt is out of date: the installed PyTorch also imports {unlisted:?}"
    );
}
