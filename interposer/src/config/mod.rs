//! The bottom layer: what the process asked for through its environment, read once at load
//! ([`env`]), the test switches that list names ([`switches`]), and the cached switches of the
//! layers above ([`layers`]). Imports nothing of this crate.

mod env;
pub(crate) mod layers;
mod switches;

pub(crate) use env::{HAMI_DEVICE_LIMITS, init};
pub(crate) use env::{all, forms, raw, var};
pub(crate) use switches::{names as switch_names, switch_on};

/// One line per problem with the environment, handed to `say` (run once at load, after the
/// log level is set, with the log's warning as `say`: this layer sits below the log): see
/// `env::report`, and the names of list switches that no reader takes (`switches::report`).
pub(crate) fn report(mut say: impl FnMut(std::fmt::Arguments<'_>)) {
    env::report(&mut say);
    switches::report(say);
}

/// Every `.rs` file under the crate's `src/` but the one named `except`, with its text: for
/// the tests that check what the sources read against the lists here.
#[cfg(test)]
fn sources(except: &str) -> Vec<(std::path::PathBuf, String)> {
    fn walk(dir: &std::path::Path, except: &str, out: &mut Vec<(std::path::PathBuf, String)>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                walk(&p, except, out);
            } else if p.extension().is_some_and(|x| x == "rs") && !p.ends_with(except) {
                let text = std::fs::read_to_string(&p).unwrap();
                out.push((p, text));
            }
        }
    }
    let mut out = Vec::new();
    walk(
        &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
        except,
        &mut out,
    );
    out
}
