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
