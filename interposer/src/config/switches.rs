//! Test switches (`VRAMSHIM_*_FAULT`, `VRAMSHIM_POOL_DEBUG`): each value is a comma-separated
//! list of names (`VRAMSHIM_POOL_DEBUG=lazy-sync,pressure-off`, `VRAMSHIM_TRACE_FAULT=no-tick`),
//! each name read by one part of the library and one variable possibly read by several parts.
//! [`SWITCHES`] is the one list of every name any reader accepts: a name outside it is said
//! once at load ([`report`]), so that a misspelt fault switch cannot turn a test that must fail
//! into one that passes without a word. Readers ask [`switch_on`] for their own names, and
//! ignore the others'. (`VRAMSHIM_CAP_FAULT` takes one name and is checked by the cap, which
//! reads it with the rest of its configuration.)
//!
//! Unit tests below check that every name a reader asks for is listed, and that every fault
//! switch the library knows is read through here.

/// Every test switch and the names its readers accept.
const SWITCHES: &[(&str, &[&str])] = &[
    (
        "VRAMSHIM_POOL_DEBUG",
        &[
            // The pool's own rules (`pool::debug_faults`).
            "runs",
            "stitch-run-pages",
            "lazy-sync",
            "reuse-early",
            "forget-rounds",
            "ignore-budget",
            "pressure-off",
            "ends-off",
            "kept",
            "kept-over-live",
            "busy-until-sync",
            "ignore-retired",
            "sync-by-mode",
            "refuse-graph-allocs",
            "graph-frees-reused",
            "fences-until-sync",
            "event-settles",
            "no-layers",
            "layers-over-live",
            // Peer access (`pool::on_peer_access`).
            "no-peer",
            // The thread caches (`pool::read_mode`); any name at all but `no-layers` and
            // the pause points, `no-tcache` the usual one, turns them off unless one of the `tcache-*` names is
            // given.
            "tcache-any-stream",
            "tcache-no-round-end",
            "tcache-no-hits",
            "tcache-no-drain",
            "tcache-keep-retired",
            "tcache-no-run",
            "no-tcache",
            // The begin-capture hooks (`pool::begin_waits_for_requests`).
            "begin-unordered",
            "begin-recorded-first",
            // The captures under way (`cuda::captures::joined`, `cuda::captures::gated`,
            // `cuda::captures::gated_held`).
            "joins-unseen",
            "sections-ungated",
            "settle-unheld",
            // The test-only pause points (`sys::pause`), not faults: with
            // `VRAMSHIM_POOL_PAUSE_FDS`, a test orders its threads by handshake.
            "pause-begin",
            "pause-request",
            "pause-settled",
        ],
    ),
    ("VRAMSHIM_DEVICE_FAULT", &["stale"]),
    ("VRAMSHIM_ENV_FAULT", &["first-32"]),
    ("VRAMSHIM_LAYERS_FAULT", &["no-light", "light-no-pitch"]),
    (
        "VRAMSHIM_PYFRAMES_FAULT",
        &["noident", "layout", "layout-unchecked"],
    ),
    (
        "VRAMSHIM_SLOTS_FAULT",
        &[
            "nowait",
            "barrier-drop",
            "barrier-no-settle",
            "per-slot-wait",
            "hand-over-uncounted",
        ],
    ),
    ("VRAMSHIM_STACKS_FAULT", &["nocache"]),
    ("VRAMSHIM_TABLE_FAULT", &["no-barrier"]),
    ("VRAMSHIM_TORCH_FAULT", &["drop"]),
    ("VRAMSHIM_TRACE_CLOCK_FAULT", &["drift"]),
    (
        "VRAMSHIM_TRACE_FAULT",
        &[
            // The trace file's opening (`tracer::writer::open_trace`).
            "unsafe-open",
            // The writer's periodic drain (`tracer::writer::tick_period`).
            "no-tick",
            // The order of a tick's steps (`tracer::writer::order_fault`).
            "partials-first",
            "late-reap",
            "late-close",
            "tid-only",
            "own-wait",
            "nested-exit-waits",
            // A slot's life token (`tracer::slots::claim`).
            "arm-in-op",
            // The signals blocked across a hand-over's send (`tracer::writer::send`).
            "send-unmasked",
            // `_exit`'s flush on the exiting thread (`tracer::writer::finish_before_exit`).
            "exit-inline",
        ],
    ),
    ("VRAMSHIM_TRACE_WRITER_FAULT", &["hold"]),
];

/// The names set in the list switch `var` (split at commas, blanks trimmed, empty ones
/// skipped); none when unset or not UTF-8.
pub(crate) fn names(var: &str) -> impl Iterator<Item = &'static str> {
    vramshim_trace::switches::names(super::var(var).unwrap_or(""))
}

/// Whether the list switch `var` names `name`.
pub(crate) fn switch_on(var: &str, name: &str) -> bool {
    names(var).any(|n| n == name)
}

/// One line per list switch that names something no reader accepts, handed to `say` (once,
/// at load, from [`super::report`]). Only a warning: the library is never the reason a job
/// stops.
pub(crate) fn report(mut say: impl FnMut(std::fmt::Arguments<'_>)) {
    for (var, accepted) in SWITCHES {
        if let Some(line) = unknown_line(var, super::var(var).unwrap_or(""), accepted) {
            say(format_args!("{line}"));
        }
    }
}

/// The line for the names in `value` (the list switch `var`'s) that are not `accepted` (None
/// when there are none), in the wording the `vramshim` command uses too
/// ([`vramshim_trace::switches::unknown_line`]); the names escaped as Rust writes them
/// (`escape_debug`: they come from the environment).
fn unknown_line(var: &str, value: &str, accepted: &[&str]) -> Option<String> {
    vramshim_trace::switches::unknown_line(var, value, accepted, |s| s.escape_debug().to_string())
}

#[cfg(test)]
mod tests {
    use super::SWITCHES;

    /// Every `switch_on("VAR", "name")` in the library's sources names a listed switch and one
    /// of its listed names, so the load-time check never warns about a name a reader takes.
    #[test]
    fn every_name_read_is_listed() {
        fn literal(s: &str) -> Option<(&str, &str)> {
            let s = s.trim_start().strip_prefix('"')?;
            let end = s.find('"')?;
            Some((&s[..end], &s[end + 1..]))
        }
        let mut found = Vec::new();
        for (p, text) in crate::config::sources("switches.rs") {
            for part in text.split("switch_on(").skip(1) {
                let (var, rest) = literal(part).unwrap_or_else(|| {
                    panic!("{}: switch_on( without a literal variable", p.display())
                });
                let rest = rest.trim_start().strip_prefix(',').unwrap();
                let (name, _) = literal(rest).unwrap_or_else(|| {
                    panic!("{}: switch_on({var:?}, without a literal name", p.display())
                });
                found.push((var.to_string(), name.to_string(), p.display().to_string()));
            }
        }
        assert!(found.len() >= 11, "the scan found too little: {found:?}");
        let unlisted: Vec<_> = found
            .iter()
            .filter(|(var, name, _)| {
                !SWITCHES
                    .iter()
                    .any(|(v, names)| v == var && names.contains(&name.as_str()))
            })
            .collect();
        assert!(unlisted.is_empty(), "read but not listed: {unlisted:?}");
    }

    /// Every fault switch the library knows (`VRAMSHIM_*_FAULT`) is listed here, and no source
    /// reads one's value itself (with `config::var`), past the check of its names; but the
    /// cap's, which the cap checks with its other variables.
    #[test]
    fn every_fault_switch_is_checked() {
        let own = |n: &str| n.starts_with("VRAMSHIM_") && n.ends_with("_FAULT");
        let unlisted: Vec<_> = super::super::env::KNOWN
            .iter()
            .filter(|n| own(n) && **n != "VRAMSHIM_CAP_FAULT")
            .filter(|n| !SWITCHES.iter().any(|(v, _)| v == *n))
            .collect();
        assert!(
            unlisted.is_empty(),
            "fault switches not listed: {unlisted:?}"
        );
        let mut read = Vec::new();
        for (p, text) in crate::config::sources("switches.rs") {
            for part in text.split("var(\"").skip(1) {
                let name: String = part
                    .chars()
                    .take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_')
                    .collect();
                if own(&name) {
                    read.push((name, p.display().to_string()));
                }
            }
        }
        assert!(
            read.is_empty(),
            "fault switches read past their check: {read:?}"
        );
    }

    /// Every listed switch and name is documented in docs/configuration.md (as `` `name` `` or
    /// `` `VAR=name` ``), so a new switch cannot be added without saying what it breaks.
    #[test]
    fn every_listed_name_is_documented() {
        let doc = include_str!("../../../docs/configuration.md");
        let mut missing = Vec::new();
        for (var, names) in SWITCHES {
            if !doc.contains(var) {
                missing.push(var.to_string());
            }
            for n in *names {
                if !doc.contains(&format!("`{n}`")) && !doc.contains(&format!("={n}`")) {
                    missing.push(format!("{var}={n}"));
                }
            }
        }
        assert!(
            missing.is_empty(),
            "switches not in docs/configuration.md: {missing:?}"
        );
    }

    #[test]
    fn unknown_names_are_said_known_ones_are_not() {
        let accepted = SWITCHES[0].1;
        let line = |v: &'static str| super::unknown_line("VRAMSHIM_POOL_DEBUG", v, accepted);
        assert_eq!(line("lazy-sync, pressure-off,no-peer,,"), None);
        assert_eq!(line(""), None);
        let one = line("lazy-sync,lazy-synk").unwrap();
        assert!(
            one.starts_with("VRAMSHIM_POOL_DEBUG: the name \"lazy-synk\" is read by no part"),
            "{one}"
        );
        assert!(
            one.contains("accepted: runs, stitch-run-pages, lazy-sync,"),
            "{one}"
        );
        assert!(
            one.ends_with(
                "ignoring it: no fault is switched on by it (the default); the other names of VRAMSHIM_POOL_DEBUG=\"lazy-sync,lazy-synk\" apply"
            ),
            "{one}"
        );
        let alone = super::unknown_line("VRAMSHIM_TRACE_FAULT", " no-tik ", &["no-tick"]).unwrap();
        assert_eq!(
            alone,
            "VRAMSHIM_TRACE_FAULT: the name \"no-tik\" is read by no part of vramshim (a test-only switch: a comma-separated list); accepted: no-tick; ignoring it: no fault is switched on by it (the default)"
        );
        let two = line("x\u{1b}[2J,no-peer,y").unwrap();
        assert!(
            two.contains("the names \"x\\u{1b}[2J\", \"y\" are read by no part"),
            "{two}"
        );
        assert!(!two.contains('\u{1b}'), "{two}");
    }
}
