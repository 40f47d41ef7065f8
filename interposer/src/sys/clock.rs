//! The process's one clock: `CLOCK_MONOTONIC` nanoseconds (served by the vDSO), what every
//! layer times with; the wall clock for the trace header; and the CPU's time-stamp counter,
//! which the tracer calibrates against the monotonic clock where the TSC is usable
//! (`tracer::clock`) because it is cheaper to read.

/// Monotonic time in nanoseconds (`CLOCK_MONOTONIC`).
#[inline]
pub(crate) fn now_ns() -> u64 {
    read(libc::CLOCK_MONOTONIC)
}

/// Wall-clock time in nanoseconds since the Unix epoch (`CLOCK_REALTIME`).
pub(crate) fn wall_ns() -> u64 {
    read(libc::CLOCK_REALTIME)
}

#[inline]
fn read(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid out-pointer; both clocks always exist on Linux.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    (ts.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec as u64)
}

/// The time-stamp counter (x86-64; 0 elsewhere, where [`tsc_usable`] is false).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) fn tsc() -> u64 {
    // SAFETY: rdtsc has no preconditions (x86-64 always has it).
    unsafe { std::arch::x86_64::_rdtsc() }
}

#[cfg(not(target_arch = "x86_64"))]
#[inline(always)]
pub(crate) fn tsc() -> u64 {
    0
}

/// Invariant TSC (CPUID 0x8000_0007 EDX bit 8) and the kernel's clocksource is `tsc` (which
/// the kernel only keeps when the TSCs of all CPUs agree): then the TSC ticks at one rate on
/// every CPU and can stand for the monotonic clock once calibrated.
#[cfg(target_arch = "x86_64")]
pub(crate) fn tsc_usable() -> bool {
    use std::arch::x86_64::__cpuid;
    // Leaf 0x8000_0000 gives the highest extended leaf, checked before 0x8000_0007.
    let invariant =
        __cpuid(0x8000_0000).eax >= 0x8000_0007 && __cpuid(0x8000_0007).edx & (1 << 8) != 0;
    invariant
        && std::fs::read_to_string(
            "/sys/devices/system/clocksource/clocksource0/current_clocksource",
        )
        .is_ok_and(|s| s.trim() == "tsc")
}

#[cfg(not(target_arch = "x86_64"))]
pub(crate) fn tsc_usable() -> bool {
    false
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_clocks_move() {
        let a = super::now_ns();
        let b = super::now_ns();
        assert!(b >= a && a > 0);
        // After 2020-01-01: the wall clock is not the monotonic one.
        assert!(super::wall_ns() > 1_577_836_800_000_000_000);
    }
}
