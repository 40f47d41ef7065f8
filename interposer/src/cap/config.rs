//! The cap's configuration, parsed once from `VRAMSHIM_CAP`, `VRAMSHIM_SHARED`,
//! `VRAMSHIM_CAP_CONTEXT` and `VRAMSHIM_CAP_FAULT`, and the limits other tools set
//! ([`super::limits`]: their variables, and the cgroup's `dmem` files, read by the caller).
//! Pure: the caller passes the lookup.

use std::path::PathBuf;

use vramshim_region::spec::{self, CapSpec};
use vramshim_region::{CapValue, MAX_DEVICES};

use super::limits::{self, DmemRegion};
use super::wait::{self, OnCap};

/// Whether the context's own memory counts against the cap (`VRAMSHIM_CAP_CONTEXT`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ContextMode {
    /// Default: the context's footprint is charged, so the process stays inside its share.
    Include,
    /// Only allocations are charged.
    Exclude,
}

/// Test-only switches (`VRAMSHIM_CAP_FAULT`) that break one safety property on purpose, so
/// the tests can show they catch it. Never set them in production.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fault {
    None,
    /// The reservation becomes load/check/store instead of a CAS.
    RacyCharge,
    /// Dead processes' slots are never reclaimed.
    NoReclaim,
    /// Liveness is judged by pid only (pid reuse fools it).
    PidOnly,
    /// A shared region's lines are keyed by CUDA ordinal instead of device UUID (region
    /// layout 1: processes with different `CUDA_VISIBLE_DEVICES` share the wrong budget).
    OrdinalLines,
    /// A shared region that cannot be used leaves the process uncapped (pass-through)
    /// instead of keeping its own cap.
    SquatPassThrough,
    /// A member that gets no slot in the shared region runs uncapped instead of being
    /// refused (the group passes its cap).
    SlotsUncapped,
    /// Charges the requested bytes instead of the device's footprint (rounding and packed
    /// pages go uncounted).
    RequestedBytes,
    /// A stream-ordered free gives its charge back at once, although the driver's pool may
    /// keep the block cached (up to its release threshold).
    AsyncUncharge,
    /// The context's footprint is charged without checking the cap.
    UncheckedContext,
    /// With the pool on, pooled requests are charged their live bytes and the pool's pages
    /// are not charged (bounded only by the process's own capped total): cached pages, the
    /// context, unpooled allocations and other members go unseen by that bound.
    PoolLiveBytes,
    /// A member SIGKILLs itself between claiming a line of the shared region and publishing
    /// it (the line is left mid-claim, as by a member killed there).
    DieClaimingLine,
    /// A line left mid-claim by a dead member is never taken over: scans wait for it, then
    /// give up (the device is refused).
    NoClaimRecovery,
    /// The cap's set-up panics before it reads the cgroup (shows that a panic there leaves
    /// the process running, uncapped, with one line).
    PanicAtSetup,
    /// Other tools' limit variables and the kernel's dmem limits are ignored (the process
    /// runs as if only `VRAMSHIM_*` existed).
    IgnoreLimits,
    /// `VRAMSHIM_ON_CAP=wait` is ignored: refused requests fail at once.
    NoWait,
    /// A waiter never checks whether the whole group waits (so a group whose holders all
    /// wait hangs until its timeout).
    WaitDeadlock,
    /// Frees never wake waiters (they notice room on their timer only).
    NoWake,
    /// The cap's set-up, in the process that loaded the library (not in a forked child),
    /// says so in one line and pauses for two minutes: a test forks while a thread is inside
    /// it, and the child must not wait for that thread.
    SetupPause,
}

/// What the variables asked for.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Settings {
    /// The caps from `VRAMSHIM_CAP` (all `None` when it is unset).
    pub spec: CapSpec,
    /// `VRAMSHIM_CAP` as given (None when unset).
    pub cap_text: Option<String>,
    /// `VRAMSHIM_SHARED` as given, and the region file it names.
    pub shared: Option<(String, PathBuf)>,
    /// `VRAMSHIM_SHARED` as given when it names no region, and why (with the accepted
    /// forms): the group's cap cannot be kept, so the cap fails closed as for a region that
    /// cannot be used (the process's own cap, or with `VRAMSHIM_CAP_STRICT=1` nothing).
    pub shared_invalid: Option<(String, String)>,
    pub context: ContextMode,
    /// `VRAMSHIM_CAP_STRICT=1`: where the cap cannot be enforced as asked (the shared region
    /// is unusable), every device allocation is refused instead of falling back.
    pub strict: bool,
    pub fault: Fault,
    /// What set each device's cap in `spec`, as messages name it (`VRAMSHIM_CAP="0.5"`,
    /// `CUDA_DEVICE_MEMORY_LIMIT_0="256m"`); None where `spec` has no cap.
    pub origin: [Option<String>; MAX_DEVICES],
    /// Limits of other tools' variables that `VRAMSHIM_CAP` replaced (said at start).
    pub replaced: Vec<String>,
    /// The cgroup's dmem regions (hard limits bound the devices they name, whatever `spec`
    /// says; mapped to devices by PCI address once the driver can tell).
    pub dmem: Vec<DmemRegion>,
    /// `VRAMSHIM_ON_CAP`: what a request refused by a shared cap does.
    pub on_cap: OnCap,
}

/// [`parse_with`] without a cgroup (the unit tests).
#[cfg(test)]
pub(crate) fn parse(
    get: &dyn Fn(&str) -> Option<String>,
    uid: u32,
) -> (Option<Settings>, Vec<String>) {
    parse_with(get, uid, Vec::new())
}

/// Parses the variables, given the cgroup's dmem regions (`limits::dmem`). `None` =
/// pass-through (nothing asked, or a bad value); the strings are the lines to print on stderr
/// (one per problem).
pub(crate) fn parse_with(
    get: &dyn Fn(&str) -> Option<String>,
    uid: u32,
    dmem: Vec<DmemRegion>,
) -> (Option<Settings>, Vec<String>) {
    let mut lines = Vec::new();
    let nonempty = |k: &str| get(k).filter(|v| !v.trim().is_empty());
    let cap_text = nonempty("VRAMSHIM_CAP");
    let shared_text = nonempty("VRAMSHIM_SHARED");

    let context = match nonempty("VRAMSHIM_CAP_CONTEXT").map(|v| v.trim().to_ascii_lowercase()) {
        None => ContextMode::Include,
        Some(v) if v == "include" => ContextMode::Include,
        Some(v) if v == "exclude" => ContextMode::Exclude,
        Some(v) => {
            lines.push(format!(
                "vramshim: VRAMSHIM_CAP_CONTEXT=\"{}\" is not valid; accepted: include (default: the context's memory counts against the cap) or exclude; using include",
                v.escape_debug()
            ));
            ContextMode::Include
        }
    };
    let fault = match nonempty("VRAMSHIM_CAP_FAULT").as_deref().map(str::trim) {
        None => Fault::None,
        Some("racy-charge") => Fault::RacyCharge,
        Some("no-reclaim") => Fault::NoReclaim,
        Some("pid-only") => Fault::PidOnly,
        Some("ordinal-lines") => Fault::OrdinalLines,
        Some("squat-pass-through") => Fault::SquatPassThrough,
        Some("slots-uncapped") => Fault::SlotsUncapped,
        Some("requested-bytes") => Fault::RequestedBytes,
        Some("unchecked-context") => Fault::UncheckedContext,
        Some("async-uncharge") => Fault::AsyncUncharge,
        Some("pool-live-bytes") => Fault::PoolLiveBytes,
        Some("die-claiming-line") => Fault::DieClaimingLine,
        Some("no-claim-recovery") => Fault::NoClaimRecovery,
        Some("ignore-limits") => Fault::IgnoreLimits,
        Some("no-wait") => Fault::NoWait,
        Some("wait-deadlock") => Fault::WaitDeadlock,
        Some("no-wake") => Fault::NoWake,
        Some("panic-at-setup") => Fault::PanicAtSetup,
        Some("setup-pause") => Fault::SetupPause,
        Some(v) => {
            lines.push(format!(
                "vramshim: VRAMSHIM_CAP_FAULT=\"{}\" is not valid (a test-only switch); accepted: racy-charge, no-reclaim, pid-only, ordinal-lines, squat-pass-through, slots-uncapped, requested-bytes, unchecked-context, async-uncharge, pool-live-bytes, die-claiming-line, no-claim-recovery, ignore-limits, no-wait, wait-deadlock, no-wake, panic-at-setup, setup-pause; ignoring it",
                v.escape_debug()
            ));
            Fault::None
        }
    };

    let strict = match nonempty("VRAMSHIM_CAP_STRICT").as_deref().map(str::trim) {
        None | Some("0") => false,
        Some("1") => true,
        Some(v) => {
            lines.push(format!(
                "vramshim: VRAMSHIM_CAP_STRICT=\"{}\" is not valid; accepted: 1 (refuse every device allocation where the cap cannot be enforced as asked) or 0 (default: keep the process's own cap); using 1",
                v.escape_debug()
            ));
            true
        }
    };
    let on_cap = match nonempty("VRAMSHIM_ON_CAP") {
        None => OnCap::Fail,
        Some(v) => match wait::parse(&v) {
            Ok(o) => o,
            Err(why) => {
                lines.push(format!(
                    "vramshim: VRAMSHIM_ON_CAP=\"{}\" is not valid ({why}); {}; refusing at once",
                    v.escape_debug(),
                    wait::FORMS
                ));
                OnCap::Fail
            }
        },
    };
    let (vars, dmem) = if fault == Fault::IgnoreLimits {
        (Default::default(), Vec::new())
    } else {
        (limits::from_env(get, &mut lines), dmem)
    };
    let has_vars = vars.iter().any(Option::is_some);
    let has_kernel = dmem.iter().any(|r| r.max.is_some());
    let mut origin: [Option<String>; MAX_DEVICES] = Default::default();
    let mut replaced = Vec::new();
    let mut cap_text = cap_text;
    let spec = match cap_text.clone() {
        None => CapSpec::none(),
        Some(t) => match spec::parse_cap(&t) {
            Ok(s) => {
                for (o, c) in origin.iter_mut().zip(&s.devices) {
                    *o = c.map(|_| format!("VRAMSHIM_CAP=\"{}\"", t.trim().escape_debug()));
                }
                for l in vars.iter().flatten() {
                    if !replaced.contains(&l.origin) {
                        replaced.push(l.origin.clone());
                    }
                }
                s
            }
            Err(reason) if has_vars || has_kernel => {
                // Fail closed: the other limits set still bound the process.
                lines.push(spec::cap_error_line(&t, &reason).replace(
                    "running without a cap (pass-through)",
                    "using the other limits set instead (docs/cap.md, \"Limits from other tools\")",
                ));
                cap_text = None;
                CapSpec::none()
            }
            Err(reason) => {
                lines.push(spec::cap_error_line(&t, &reason));
                return (None, lines);
            }
        },
    };
    let spec = if cap_text.is_none() && has_vars {
        // The variables' caps, per device (bytes): one value for all devices when they agree.
        let devices: [Option<CapValue>; MAX_DEVICES] =
            std::array::from_fn(|d| vars[d].as_ref().map(|l| CapValue::Bytes(l.bytes)));
        for (o, l) in origin.iter_mut().zip(&vars) {
            *o = l.as_ref().map(|l| l.origin.clone());
        }
        let all = devices.iter().all(|c| c.is_some() && *c == devices[0]);
        CapSpec { devices, all }
    } else {
        spec
    };
    // A name that names no region is a group cap that cannot be kept: it fails closed when
    // the cap is set up (`Cap::region_unusable` says what is kept, in one line).
    let (shared, shared_invalid) = match &shared_text {
        None => (None, None),
        Some(t) => match spec::shared_path(t, uid) {
            Ok(p) => (Some((t.trim().to_string(), p)), None),
            Err(reason) => (
                None,
                Some((
                    t.clone(),
                    format!("not a valid name ({reason}); {}", spec::SHARED_FORMS),
                )),
            ),
        },
    };
    if cap_text.is_none()
        && shared.is_none()
        && shared_invalid.is_none()
        && !has_vars
        && !has_kernel
    {
        return (None, lines);
    }
    if on_cap != OnCap::Fail && shared.is_none() && shared_invalid.is_none() {
        lines.push(
            "vramshim: VRAMSHIM_ON_CAP=wait has no effect without VRAMSHIM_SHARED (only the members of a group can free what a refused request waits for); refusing at once".into(),
        );
    }
    (
        Some(Settings {
            spec,
            cap_text,
            shared,
            shared_invalid,
            context,
            strict,
            fault,
            origin,
            replaced,
            dmem,
            on_cap,
        }),
        lines,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use vramshim_region::CapValue;

    fn run(vars: &[(&str, &str)]) -> (Option<Settings>, Vec<String>) {
        let vars: Vec<(String, String)> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        parse(
            &move |k| vars.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone()),
            1000,
        )
    }

    #[test]
    fn nothing_set_is_pass_through_silently() {
        assert_eq!(run(&[]), (None, vec![]));
        assert_eq!(run(&[("VRAMSHIM_CAP", "  ")]), (None, vec![]));
    }

    #[test]
    fn good_values() {
        let (s, lines) = run(&[
            ("VRAMSHIM_CAP", "0=40GiB,1=0.5"),
            ("VRAMSHIM_SHARED", "job"),
        ]);
        assert!(lines.is_empty());
        let s = s.unwrap();
        assert_eq!(s.spec.get(0), Some(CapValue::Bytes(40 << 30)));
        assert_eq!(
            s.shared.unwrap().1,
            PathBuf::from("/dev/shm/vramshim-1000-job")
        );
        assert_eq!(s.context, ContextMode::Include);
        let (s, _) = run(&[
            ("VRAMSHIM_SHARED", "job"),
            ("VRAMSHIM_CAP_CONTEXT", "Exclude"),
        ]);
        let s = s.unwrap();
        assert_eq!(s.spec, CapSpec::none());
        assert_eq!(s.context, ContextMode::Exclude);
    }

    /// Each bad value: exactly one line naming the variable, the value and the forms; no cap.
    #[test]
    fn bad_values_give_one_line_and_pass_through() {
        for bad in ["1.5", "-1", "abc", "0=", "16=1GiB", "0.5GiX"] {
            let (s, lines) = run(&[("VRAMSHIM_CAP", bad)]);
            assert!(s.is_none(), "{bad}");
            assert_eq!(lines.len(), 1, "{bad}: {lines:?}");
            let l = &lines[0];
            assert!(l.contains(&format!("VRAMSHIM_CAP=\"{bad}\"")), "{l}");
            assert!(
                l.contains("0=40GiB,1=0.5") && l.contains("pass-through"),
                "{l}"
            );
        }
    }

    /// A `VRAMSHIM_SHARED` that names no region is kept as such (with the reason and the
    /// accepted forms) for the set-up to fail closed on, whatever else is set; nothing said
    /// at parse time (the set-up says it once, with what the process keeps).
    #[test]
    fn a_bad_shared_name_is_kept_to_fail_closed() {
        for (vars, own) in [
            (
                &[("VRAMSHIM_CAP", "0.5"), ("VRAMSHIM_SHARED", "a/b")][..],
                true,
            ),
            (&[("VRAMSHIM_SHARED", "a/b")][..], false),
            (
                &[("VRAMSHIM_SHARED", "a/b"), ("VRAMSHIM_CAP_STRICT", "1")][..],
                false,
            ),
            (
                &[("GPU_MEMORY_LIMIT", "1g"), ("VRAMSHIM_SHARED", "a/b")][..],
                true,
            ),
        ] {
            let (s, lines) = run(vars);
            assert!(lines.is_empty(), "{vars:?}: {lines:?}");
            let s = s.unwrap_or_else(|| panic!("{vars:?}: pass-through"));
            assert_eq!(s.shared, None);
            let (name, why) = s.shared_invalid.unwrap();
            assert_eq!(name, "a/b");
            assert!(why.contains(spec::SHARED_FORMS), "{why}");
            assert_eq!(s.spec.get(0).is_some(), own, "{vars:?}");
        }
        let (s, _) = run(&[("VRAMSHIM_SHARED", &"x".repeat(65))]);
        assert!(
            s.unwrap()
                .shared_invalid
                .unwrap()
                .1
                .contains("longer than 64")
        );
    }

    /// Other tools' variables alone make a cap (per device, the smallest, named); with
    /// `VRAMSHIM_CAP` they are replaced (and listed as such); a bad `VRAMSHIM_CAP` falls back
    /// to them; a kernel limit alone makes the settings exist (mapped at setup).
    #[test]
    fn limits_of_other_tools() {
        let (s, lines) = run(&[
            ("CUDA_DEVICE_MEMORY_LIMIT", "2g"),
            ("CUDA_DEVICE_MEMORY_LIMIT_1", "1g"),
        ]);
        assert!(lines.is_empty(), "{lines:?}");
        let s = s.unwrap();
        assert_eq!(s.cap_text, None);
        assert_eq!(s.spec.get(0), Some(CapValue::Bytes(2 << 30)));
        assert_eq!(s.spec.get(1), Some(CapValue::Bytes(1 << 30)));
        assert!(!s.spec.all);
        assert_eq!(
            s.origin[1].as_deref(),
            Some("CUDA_DEVICE_MEMORY_LIMIT_1=\"1g\"")
        );
        // One value for every device: the single-value form.
        let (s, _) = run(&[("GPU_MEMORY_LIMIT", "1073741824")]);
        let s = s.unwrap();
        assert!(s.spec.all && s.spec.get(15) == Some(CapValue::Bytes(1 << 30)));

        let (s, _) = run(&[("VRAMSHIM_CAP", "0.5"), ("GPU_MEMORY_LIMIT", "1g")]);
        let s = s.unwrap();
        assert_eq!(s.spec.get(0), Some(CapValue::Fraction(0.5)));
        assert_eq!(s.origin[0].as_deref(), Some("VRAMSHIM_CAP=\"0.5\""));
        assert_eq!(s.replaced, vec!["GPU_MEMORY_LIMIT=\"1g\"".to_string()]);

        let (s, lines) = run(&[("VRAMSHIM_CAP", "1.5"), ("GPU_MEMORY_LIMIT", "1g")]);
        let s = s.unwrap();
        assert_eq!(s.spec.get(0), Some(CapValue::Bytes(1 << 30)));
        assert_eq!(lines.len(), 1);
        assert!(
            lines[0].contains("using the other limits set instead"),
            "{}",
            lines[0]
        );

        let dmem = vec![DmemRegion {
            region: "drm/0000:01:00.0/vram0".into(),
            max: Some(1 << 30),
            max_file: None,
            min: None,
        }];
        let (s, _) = parse_with(&|_| None, 1000, dmem.clone());
        let s = s.unwrap();
        assert_eq!(s.spec, CapSpec::none());
        assert_eq!(s.dmem, dmem);
        // The fault switch drops them.
        let (s, _) = run(&[
            ("GPU_MEMORY_LIMIT", "1g"),
            ("VRAMSHIM_CAP_FAULT", "ignore-limits"),
        ]);
        assert!(s.is_none());
    }

    #[test]
    fn minor_variables_fall_back_with_a_warning() {
        let (s, lines) = run(&[
            ("VRAMSHIM_CAP", "0.5"),
            ("VRAMSHIM_CAP_CONTEXT", "maybe"),
            ("VRAMSHIM_CAP_FAULT", "x"),
        ]);
        let s = s.unwrap();
        assert_eq!((s.context, s.fault), (ContextMode::Include, Fault::None));
        assert_eq!(lines.len(), 2);
        let (s, _) = run(&[
            ("VRAMSHIM_CAP", "0.5"),
            ("VRAMSHIM_CAP_FAULT", "racy-charge"),
        ]);
        assert_eq!(s.unwrap().fault, Fault::RacyCharge);
    }
}
