//! Injected latency (`VRAMSIM_LATENCY`) and failures (`VRAMSIM_FAIL`), matched by the API's
//! base name (`cuMemAlloc` matches `cuMemAlloc_v2`, `cuMemAllocAsync` matches `_ptsz`), and
//! the pause point of interleaving tests (`VRAMSIM_PAUSE_IN`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use vramsim_devstate::parse::{parse_duration, parse_size};

use crate::abi::{CUDA_ERROR_OUT_OF_MEMORY, CUresult, Res};
use crate::config::CONFIG;

#[derive(Debug)]
pub enum FailKind {
    /// Every Nth call fails.
    Nth(u64),
    /// A call fails when the bytes of the calls let through so far plus its own exceed this.
    After(u64),
}

#[derive(Debug)]
pub struct FailRule {
    pub name: String,
    pub kind: FailKind,
    pub code: CUresult,
    counter: AtomicU64,
}

/// `cuMemAlloc_v2` -> `cuMemAlloc`, `cuMemcpyAsync_ptsz` -> `cuMemcpyAsync`.
pub fn base_name(name: &str) -> &str {
    let s = name
        .strip_suffix("_ptsz")
        .or_else(|| name.strip_suffix("_ptds"))
        .unwrap_or(name);
    match s.rfind("_v") {
        Some(i) if i + 2 < s.len() && s[i + 2..].bytes().all(|b| b.is_ascii_digit()) => &s[..i],
        _ => s,
    }
}

pub fn parse_latency(s: &str) -> Option<Vec<(String, Duration)>> {
    s.split(',')
        .filter(|p| !p.trim().is_empty())
        .map(|p| {
            let (name, d) = p.split_once('=')?;
            let name = name.trim();
            if name.is_empty() {
                return None;
            }
            Some((base_name(name).to_string(), parse_duration(d)?))
        })
        .collect()
}

pub fn parse_fail(s: &str) -> Option<Vec<FailRule>> {
    s.split(',')
        .filter(|p| !p.trim().is_empty())
        .map(|p| {
            let mut parts = p.trim().split(':');
            let name = base_name(parts.next()?.trim()).to_string();
            let mut kind = None;
            let mut code = CUDA_ERROR_OUT_OF_MEMORY;
            for kv in parts {
                let (k, v) = kv.split_once('=')?;
                match k.trim() {
                    "nth" => kind = Some(FailKind::Nth(v.trim().parse().ok().filter(|n| *n > 0)?)),
                    "after" => kind = Some(FailKind::After(parse_size(v)?)),
                    "code" => code = v.trim().parse().ok()?,
                    _ => return None,
                }
            }
            if name.is_empty() {
                return None;
            }
            Some(FailRule {
                name,
                kind: kind?,
                code,
                counter: AtomicU64::new(0),
            })
        })
        .collect()
}

/// Runs on every exported call: injected latency, then `nth` failures.
pub fn on_call(name: &str) -> Res {
    let cfg = &*CONFIG;
    if cfg.latency.is_empty() && cfg.fail.is_empty() {
        return Ok(());
    }
    let base = base_name(name);
    let lat = cfg
        .latency
        .iter()
        .find(|(n, _)| n == base)
        .or_else(|| cfg.latency.iter().find(|(n, _)| n == "*"));
    if let Some((_, d)) = lat {
        delay(*d);
    }
    for r in cfg.fail.iter().filter(|r| r.name == base) {
        if let FailKind::Nth(n) = r.kind
            && (r.counter.fetch_add(1, Ordering::Relaxed) + 1) % n == 0
        {
            return Err(r.code);
        }
    }
    Ok(())
}

/// Runs in calls that request memory: `after=SIZE` failures.
pub fn on_bytes(base: &str, bytes: u64) -> Res {
    for r in CONFIG.fail.iter().filter(|r| r.name == base) {
        if let FailKind::After(limit) = r.kind {
            let before = r.counter.fetch_add(bytes, Ordering::Relaxed);
            if before.saturating_add(bytes) > limit {
                r.counter.fetch_sub(bytes, Ordering::Relaxed);
                return Err(r.code);
            }
        }
    }
    Ok(())
}

/// Waits `d`: spinning for short waits (sleep granularity would swamp them), sleeping otherwise.
/// Never inlined: a profile tells the modelled device time (the spin, whose instruction
/// count follows wall time) from the work around it by this name (scripts/bench-models).
#[inline(never)]
pub fn delay(d: Duration) {
    if d.is_zero() {
        return;
    }
    if d < Duration::from_micros(100) {
        let end = Instant::now() + d;
        while Instant::now() < end {
            std::hint::spin_loop();
        }
    } else {
        std::thread::sleep(d);
    }
}

/// The pause point's state: (a call stopped there, the test let it go).
static PAUSE: Mutex<(bool, bool)> = Mutex::new((false, false));
static PAUSE_CV: Condvar = Condvar::new();

/// On entry to every driver call: the first call of `VRAMSIM_PAUSE_IN`'s function stops here
/// until [`pause_release`] (a test then does something else while that call is under way).
pub fn pause_point(name: &str) {
    let Some(at) = CONFIG.pause_in.as_deref() else {
        return;
    };
    if base_name(name) != at {
        return;
    }
    let mut st = PAUSE.lock().unwrap_or_else(|e| e.into_inner());
    if st.0 {
        return;
    }
    st.0 = true;
    PAUSE_CV.notify_all();
    while !st.1 {
        st = PAUSE_CV.wait(st).unwrap_or_else(|e| e.into_inner());
    }
}

/// Waits up to `timeout` for a call to stop at the pause point: whether one did.
pub fn pause_wait(timeout: Duration) -> bool {
    let st = PAUSE.lock().unwrap_or_else(|e| e.into_inner());
    let (st, _) = PAUSE_CV
        .wait_timeout_while(st, timeout, |s| !s.0)
        .unwrap_or_else(|e| e.into_inner());
    st.0
}

/// Lets the call stopped at the pause point (and any later one) go on.
pub fn pause_release() {
    let mut st = PAUSE.lock().unwrap_or_else(|e| e.into_inner());
    st.1 = true;
    PAUSE_CV.notify_all();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_names() {
        assert_eq!(base_name("cuMemAlloc_v2"), "cuMemAlloc");
        assert_eq!(base_name("cuMemAllocAsync_ptsz"), "cuMemAllocAsync");
        assert_eq!(base_name("cuMemcpyHtoD_v2_ptds"), "cuMemcpyHtoD");
        assert_eq!(base_name("cuMemMap"), "cuMemMap");
        assert_eq!(base_name("cuCtxCreate_v4"), "cuCtxCreate");
    }

    #[test]
    fn parses_rules() {
        let l = parse_latency("cuMemAlloc=20us,cuMemMap_v2=5us,*=1us").unwrap();
        assert_eq!(l.len(), 3);
        assert_eq!(l[1].0, "cuMemMap");
        assert!(parse_latency("cuMemAlloc=fast").is_none());
        let f = parse_fail("cuMemCreate:nth=10,cuMemAlloc:after=4GiB:code=2").unwrap();
        assert_eq!(f.len(), 2);
        assert!(matches!(f[1].kind, FailKind::After(n) if n == 4 << 30));
        assert!(parse_fail("cuMemCreate:every=10").is_none());
        assert!(parse_fail("cuMemCreate").is_none());
    }
}
