//! How `vramshim run --pool stitch` routes PyTorch's tensors to the pool: the `PYTORCH_*`
//! variables to set, merged with what the user already set.
//!
//! PyTorch's caching allocator keeps its tensors to itself, so the pool only serves PyTorch
//! when PyTorch hands each tensor to CUDA. Three routes:
//! - `async` (the default): `backend:cudaMallocAsync`, each tensor a `cudaMallocAsync` /
//!   `cudaFreeAsync`, reusable at once in stream order, so the pool never synchronizes for it;
//! - `uncached`: `PYTORCH_NO_CUDA_MEMORY_CACHING=1`, each tensor a `cudaMalloc` / `cudaFree`,
//!   reusable only behind a synchronization;
//! - `native`: nothing set (PyTorch's cache sits in front of the pool).
//!
//! The allocator settings are read from and written to both `PYTORCH_ALLOC_CONF` (the
//! primary name since PyTorch 2.10) and `PYTORCH_CUDA_ALLOC_CONF`, each merged on its own:
//! PyTorch 2.15 reads `PYTORCH_CUDA_ALLOC_CONF` alone whenever it is set (the other is then
//! ignored whole), older versions read only it, so both must say the same backend. A user who already chose an allocator (a `backend` key, or
//! `PYTORCH_NO_CUDA_MEMORY_CACHING` set to anything) keeps that choice.

/// PyTorch's allocator settings, the current name first.
pub const CONF_VARS: [&str; 2] = ["PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF"];
/// PyTorch's uncached switch.
pub const NO_CACHING: &str = "PYTORCH_NO_CUDA_MEMORY_CACHING";
/// The route's environment equivalent of `--pytorch-route`.
pub const ROUTE_VAR: &str = "VRAMSHIM_PYTORCH_ROUTE";
/// The backend of the `async` route.
pub const ASYNC_BACKEND: &str = "cudaMallocAsync";

/// Options of PyTorch's native caching allocator, which the `cudaMallocAsync` backend ignores
/// (with a warning): dropped on the `async` route.
const NATIVE_ONLY: [&str; 6] = [
    "expandable_segments",
    "max_split_size_mb",
    "max_non_split_rounding_mb",
    "roundup_power2_divisions",
    "garbage_collection_threshold",
    "release_lock_on_cudamalloc",
];

/// See the module documentation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    Async,
    Uncached,
    Native,
}

impl Route {
    /// `async`, `uncached` or `native`; the error names `what` and the accepted forms.
    pub fn parse(v: &str, what: &str) -> Result<Route, String> {
        match v.trim() {
            "async" => Ok(Route::Async),
            "uncached" => Ok(Route::Uncached),
            "native" => Ok(Route::Native),
            other => Err(format!(
                "{what}: {other:?} is not a PyTorch route (accepted: async, uncached, native)"
            )),
        }
    }
}

/// What to set in the child's environment, and at most one line to tell the user.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct TorchEnv {
    pub set: Vec<(&'static str, String)>,
    pub note: Option<String>,
}

/// The settings of `route` given the user's environment (`get` reads a variable; an empty
/// value counts as unset, as PyTorch treats it).
pub fn plan(route: Route, get: &dyn Fn(&str) -> Option<String>) -> TorchEnv {
    let get = |k: &str| get(k).filter(|v| !v.trim().is_empty());
    let mut out = TorchEnv::default();
    match route {
        Route::Native => {}
        Route::Uncached => {
            if get(NO_CACHING).is_none() {
                out.set.push((NO_CACHING, "1".into()));
            }
        }
        Route::Async => {
            // a backend under either name is the user's choice (each PyTorch version reads
            // one of them)
            let chosen: Vec<(&str, String)> = CONF_VARS
                .iter()
                .filter_map(|k| get(k).and_then(|c| backend_of(&c)).map(|b| (*k, b)))
                .collect();
            if !chosen.is_empty() {
                if let Some((name, backend)) = chosen.iter().find(|(_, b)| b != ASYNC_BACKEND) {
                    out.note = Some(format!(
                        "{name} sets backend:{backend}: kept (the pool then serves what that \
                         allocator asks CUDA for; without it each tensor goes to the pool \
                         through backend:{ASYNC_BACKEND})"
                    ));
                }
                return out;
            }
            // a name the user left unset gets the other's settings
            let effective = CONF_VARS.iter().find_map(|k| get(k));
            if let Some(v) = get(NO_CACHING) {
                out.note = Some(format!(
                    "{NO_CACHING}={v} is set: PyTorch's allocator is left as you set it, \
                     whatever the route (unset it to route tensors through {ASYNC_BACKEND})"
                ));
                return out;
            }
            let mut dropped: Vec<String> = Vec::new();
            for name in CONF_VARS {
                let user = get(name).or_else(|| effective.clone());
                let (conf, gone) = merge_async(user.as_deref().unwrap_or(""));
                for g in gone {
                    if !dropped.contains(&g) {
                        dropped.push(g);
                    }
                }
                out.set.push((name, conf));
            }
            if !dropped.is_empty() {
                out.note = Some(format!(
                    "PyTorch goes through backend:{ASYNC_BACKEND} for the pool; dropped {} from \
                     its allocator settings (options of PyTorch's native allocator only; \
                     --pytorch-route native keeps them)",
                    dropped.join(",")
                ));
            }
        }
    }
    out
}

/// The entries of an allocator setting: split at commas outside brackets
/// (`roundup_power2_divisions:[256:1,512:2]` is one entry), trimmed, empty ones left out.
fn entries(conf: &str) -> Vec<&str> {
    let mut v = Vec::new();
    let (mut depth, mut start) = (0i32, 0usize);
    for (i, c) in conf.char_indices() {
        match c {
            '[' => depth += 1,
            ']' => depth -= 1,
            ',' if depth <= 0 => {
                v.push(&conf[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    v.push(&conf[start..]);
    v.into_iter()
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .collect()
}

/// An entry's key and value (`key:value`, spaces around either ignored).
fn key_value(entry: &str) -> (&str, &str) {
    match entry.split_once(':') {
        Some((k, v)) => (k.trim(), v.trim()),
        None => (entry.trim(), ""),
    }
}

/// The `backend` a setting names (the last one, as a later key overrides an earlier one).
pub fn backend_of(conf: &str) -> Option<String> {
    entries(conf)
        .into_iter()
        .map(key_value)
        .filter(|(k, _)| *k == "backend")
        .map(|(_, v)| v.to_string())
        .next_back()
}

/// `conf` with `backend:cudaMallocAsync` first and the native-only options left out (also
/// returned, as written).
fn merge_async(conf: &str) -> (String, Vec<String>) {
    let mut kept = vec![format!("backend:{ASYNC_BACKEND}")];
    let mut dropped = Vec::new();
    for e in entries(conf) {
        let (k, _) = key_value(e);
        if NATIVE_ONLY.contains(&k) {
            dropped.push(e.to_string());
        } else if k != "backend" {
            kept.push(e.to_string());
        }
    }
    (kept.join(","), dropped)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn plan_with(route: Route, vars: &[(&str, &str)]) -> TorchEnv {
        let m: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        plan(route, &|k| m.get(k).cloned())
    }

    fn both(conf: &str) -> Vec<(&'static str, String)> {
        CONF_VARS.iter().map(|k| (*k, conf.to_string())).collect()
    }

    #[test]
    fn nothing_set_routes_through_cuda_malloc_async_under_both_names() {
        let p = plan_with(Route::Async, &[]);
        assert_eq!(p.set, both("backend:cudaMallocAsync"));
        assert_eq!(p.note, None);
    }

    #[test]
    fn other_options_are_kept_and_native_only_ones_dropped_with_one_line() {
        let p = plan_with(
            Route::Async,
            &[(
                "PYTORCH_CUDA_ALLOC_CONF",
                "expandable_segments:True, pinned_use_cuda_host_register:True,max_split_size_mb:128",
            )],
        );
        assert_eq!(
            p.set,
            both("backend:cudaMallocAsync,pinned_use_cuda_host_register:True")
        );
        let note = p.note.unwrap();
        assert!(
            note.contains("expandable_segments:True,max_split_size_mb:128"),
            "{note}"
        );
        assert!(!note.contains('\n'));
    }

    #[test]
    fn bracketed_values_stay_one_entry() {
        let p = plan_with(
            Route::Async,
            &[(
                "PYTORCH_ALLOC_CONF",
                "roundup_power2_divisions:[256:1,512:2],pinned_num_register_threads:8",
            )],
        );
        assert_eq!(
            p.set,
            both("backend:cudaMallocAsync,pinned_num_register_threads:8")
        );
        assert!(
            p.note
                .unwrap()
                .contains("roundup_power2_divisions:[256:1,512:2]")
        );
    }

    #[test]
    fn each_name_is_merged_on_its_own() {
        let p = plan_with(
            Route::Async,
            &[
                ("PYTORCH_ALLOC_CONF", "pinned_num_register_threads:4"),
                ("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:64"),
            ],
        );
        assert_eq!(
            p.set,
            vec![
                (
                    "PYTORCH_ALLOC_CONF",
                    "backend:cudaMallocAsync,pinned_num_register_threads:4".to_string()
                ),
                (
                    "PYTORCH_CUDA_ALLOC_CONF",
                    "backend:cudaMallocAsync".to_string()
                ),
            ]
        );
        assert!(p.note.unwrap().contains("max_split_size_mb:64"));
    }

    #[test]
    fn a_backend_the_user_chose_is_kept() {
        // native, under either name: nothing written, one line says so
        for name in CONF_VARS {
            let p = plan_with(
                Route::Async,
                &[(name, "backend:native,expandable_segments:True")],
            );
            assert!(p.set.is_empty(), "{name}: {p:?}");
            let note = p.note.unwrap();
            assert!(
                note.contains(name) && note.contains("backend:native"),
                "{note}"
            );
        }
        // cudaMallocAsync already: nothing to do, nothing to say
        let p = plan_with(
            Route::Async,
            &[("PYTORCH_CUDA_ALLOC_CONF", "backend: cudaMallocAsync")],
        );
        assert_eq!(p, TorchEnv::default());
        // a backend under one name only: neither name is written
        let p = plan_with(
            Route::Async,
            &[
                ("PYTORCH_ALLOC_CONF", "max_split_size_mb:64"),
                ("PYTORCH_CUDA_ALLOC_CONF", "backend:native"),
            ],
        );
        assert!(p.set.is_empty());
        assert!(
            p.note
                .unwrap()
                .contains("PYTORCH_CUDA_ALLOC_CONF sets backend:native")
        );
    }

    #[test]
    fn a_caching_switch_the_user_set_is_kept() {
        for v in ["0", "1"] {
            let p = plan_with(Route::Async, &[(NO_CACHING, v)]);
            assert!(p.set.is_empty());
            assert!(p.note.unwrap().contains(&format!("{NO_CACHING}={v}")));
        }
        let p = plan_with(Route::Uncached, &[(NO_CACHING, "0")]);
        assert!(p.set.is_empty(), "the user's value wins");
    }

    #[test]
    fn empty_values_count_as_unset() {
        let p = plan_with(
            Route::Async,
            &[("PYTORCH_ALLOC_CONF", " "), (NO_CACHING, "")],
        );
        assert_eq!(p.set, both("backend:cudaMallocAsync"));
    }

    #[test]
    fn uncached_and_native_routes() {
        let p = plan_with(
            Route::Uncached,
            &[("PYTORCH_ALLOC_CONF", "max_split_size_mb:64")],
        );
        assert_eq!(p.set, vec![(NO_CACHING, "1".to_string())]);
        assert_eq!(p.note, None);
        let p = plan_with(Route::Native, &[]);
        assert_eq!(p, TorchEnv::default());
    }

    #[test]
    fn route_names() {
        assert_eq!(Route::parse("async", "x"), Ok(Route::Async));
        assert_eq!(Route::parse(" uncached", "x"), Ok(Route::Uncached));
        assert_eq!(Route::parse("native", "x"), Ok(Route::Native));
        let e = Route::parse("fast", "VRAMSHIM_PYTORCH_ROUTE").unwrap_err();
        assert!(e.contains("VRAMSHIM_PYTORCH_ROUTE") && e.contains("async, uncached, native"));
    }
}
