//! The configuration of every property test (`proptest!`): a known seed, said on every run, and
//! new failures kept out of the source tree.
//!
//! * The seed: `PROPTEST_RNG_SEED=N` when set (proptest reads it too), else the day's seed,
//!   the days since 1970-01-01 (UTC). The day's seed, not a random one: two runs of the same
//!   commit on the same day (CI and its rerun, a developer after a red CI) draw the same cases,
//!   so their verdicts are comparable and a red one reproduces with no seed to find; the
//!   cases still change every day, so over time they explore as random seeds would. Every run
//!   says its seed: once per test binary on stderr (not captured by the test harness), and in
//!   each property test's own output (shown with its failure), with the command to rerun it.
//! * Failures: the seeds kept in the tree next to a test (`<test>.proptest-regressions`,
//!   checked in, replayed first) are read; a new failure's seed is written under the target
//!   directory (`<profile>/proptest-regressions/`), never into the clone's tree, and read back
//!   on the next runs there. To keep one for good, copy its `cc` line into the file in the tree.

use std::any::Any;
use std::fmt;
use std::sync::Once;

use proptest::test_runner::{
    Config, FailurePersistence, FileFailurePersistence, PersistedSeed, RngSeed,
};

/// The variable proptest reads the seed from (and [`seed`] too).
pub const SEED_VAR: &str = "PROPTEST_RNG_SEED";

/// Where a seed came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SeedFrom {
    /// `PROPTEST_RNG_SEED`.
    Env,
    /// The day (UTC): `PROPTEST_RNG_SEED` unset.
    Day,
}

/// The seed of this run, and where it came from (see the module's documentation). A
/// `PROPTEST_RNG_SEED` that is not a whole number is said once and the day's seed used (as
/// proptest itself does with its default).
pub fn seed() -> (u64, SeedFrom) {
    seed_of(std::env::var(SEED_VAR).ok().as_deref(), day())
}

/// [`seed`] for a given `PROPTEST_RNG_SEED` (`None`: unset) and day.
pub fn seed_of(var: Option<&str>, day: u64) -> (u64, SeedFrom) {
    match var.map(str::trim) {
        Some(v) if !v.is_empty() => match v.parse::<u64>() {
            Ok(n) => (n, SeedFrom::Env),
            Err(_) => {
                eprintln!("{SEED_VAR}={v:?} is not a whole number: using the day's seed {day}");
                (day, SeedFrom::Day)
            }
        },
        _ => (day, SeedFrom::Day),
    }
}

/// Days since 1970-01-01, UTC.
fn day() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() / 86_400)
}

/// The line a run says its seed with.
pub fn seed_line(seed: u64, from: SeedFrom) -> String {
    let how = match from {
        SeedFrom::Env => "from PROPTEST_RNG_SEED",
        SeedFrom::Day => "the day's (UTC)",
    };
    format!(
        "proptest seed {seed} ({how}); rerun with PROPTEST_RNG_SEED={seed} \
         (and the same PROPTEST_CASES, if set)"
    )
}

/// A property test's configuration: `cases` cases (`PROPTEST_CASES` overrides it), the run's
/// seed ([`seed`]), failures kept as the module's documentation says. For
/// `#![proptest_config(vramshim_testkit::props::config(96))]`.
pub fn config(cases: u32) -> Config {
    let (seed, from) = seed();
    let line = seed_line(seed, from);
    static SAID: Once = Once::new();
    SAID.call_once(|| {
        use std::io::Write;
        // Straight to stderr: the harness captures only the print macros' output.
        let _ = writeln!(std::io::stderr(), "\n{line}");
    });
    // Captured with the test's output: shown with its failure.
    eprintln!("{line}");
    Config {
        cases,
        rng_seed: RngSeed::Fixed(seed),
        failure_persistence: Some(Box::new(KeptInTree { out: out_dir() })),
        ..Config::default()
    }
}

/// The directory new failures are written to: `proptest-regressions` beside the test binary's
/// `deps` directory (the profile directory under the target directory).
fn out_dir() -> Option<&'static str> {
    let exe = std::env::current_exe().ok()?;
    let profile = exe.parent()?.parent()?;
    let dir = profile.join("proptest-regressions").to_str()?.to_owned();
    Some(Box::leak(dir.into_boxed_str()))
}

/// Reads the seeds kept in the tree and those written under the target directory; writes new
/// ones only there.
#[derive(Clone, Debug, PartialEq)]
struct KeptInTree {
    out: Option<&'static str>,
}

impl KeptInTree {
    /// The file under [`out_dir`] for the test source `source`.
    fn out_file(&self, source: Option<&'static str>) -> Option<FileFailurePersistence> {
        let dir = self.out?;
        let name = source?.replace(['/', '\\'], "__");
        let path = format!("{dir}/{name}.txt");
        Some(FileFailurePersistence::Direct(Box::leak(
            path.into_boxed_str(),
        )))
    }
}

/// The kept seeds' file: `<test>.proptest-regressions` beside the test's source.
const IN_TREE: FileFailurePersistence = FileFailurePersistence::WithSource("proptest-regressions");

impl FailurePersistence for KeptInTree {
    fn load_persisted_failures2(&self, source: Option<&'static str>) -> Vec<PersistedSeed> {
        let mut seeds = IN_TREE.load_persisted_failures2(source);
        if let Some(out) = self.out_file(source) {
            for s in out.load_persisted_failures2(source) {
                if !seeds.contains(&s) {
                    seeds.push(s);
                }
            }
        }
        seeds
    }

    fn save_persisted_failure2(
        &mut self,
        source: Option<&'static str>,
        seed: PersistedSeed,
        shrunken: &dyn fmt::Debug,
    ) {
        if let Some(mut out) = self.out_file(source) {
            out.save_persisted_failure2(source, seed, shrunken);
        }
    }

    fn box_clone(&self) -> Box<dyn FailurePersistence> {
        Box::new(self.clone())
    }

    fn eq(&self, other: &dyn FailurePersistence) -> bool {
        other.as_any().downcast_ref::<Self>() == Some(self)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_seed_is_the_variables_or_the_days() {
        assert_eq!(seed_of(Some("42"), 20_000), (42, SeedFrom::Env));
        assert_eq!(seed_of(Some(" 7 "), 20_000), (7, SeedFrom::Env));
        assert_eq!(seed_of(None, 20_000), (20_000, SeedFrom::Day));
        assert_eq!(seed_of(Some(""), 20_000), (20_000, SeedFrom::Day));
        assert_eq!(seed_of(Some("random"), 20_000), (20_000, SeedFrom::Day));
    }

    #[test]
    fn the_config_uses_the_seed_and_keeps_failures_under_the_target_directory() {
        let c = config(5);
        assert_eq!(c.cases, 5);
        assert_eq!(c.rng_seed, RngSeed::Fixed(seed().0));
        let keep = c.failure_persistence.as_ref().unwrap();
        let keep = keep.as_any().downcast_ref::<KeptInTree>().unwrap();
        let out = keep.out.unwrap();
        let exe = std::env::current_exe().unwrap();
        let target = exe.parent().unwrap().parent().unwrap();
        assert!(
            std::path::Path::new(out).starts_with(target),
            "{out} is not under {}",
            target.display()
        );
    }
}
