//! A cap above the device's own memory. On a MIG slice or a vGPU profile the driver reports
//! the slice's (the profile's) memory as the device's total, and NVML's memory information
//! of the device handle says the same; that total, not the cap, bounds the process first. A
//! byte cap above it (a cap written for the whole GPU, or another tool's limit that
//! oversubscribes) is said once per device, naming both and which one binds: memory queries
//! already report the smaller of the two as the total, and the device, not the cap, refuses
//! past it.

use std::sync::atomic::Ordering::Relaxed;

use vramshim_region::MAX_BYTES;
use vramshim_region::spec::human_bytes;

use super::Cap;

impl Cap {
    /// Device `d`'s cap resolved to `cap` bytes (`real_total`: the device's total when the
    /// caller knows it): say once when the device's own memory is smaller.
    #[cold]
    pub(super) fn note_device_bound(&self, d: usize, cap: u64, real_total: Option<u64>) {
        if cap >= MAX_BYTES || self.above_device_said[d].load(Relaxed) {
            return;
        }
        let Some(total) = real_total
            .filter(|&t| t > 0)
            .or_else(|| (self.queries().total)(d as i32))
        else {
            return;
        };
        if cap <= total || self.above_device_said[d].swap(true, Relaxed) {
            return;
        }
        (self.log)(&format!(
            "vramshim: the cap of device {d} ({}, set by {}) is above the device's own memory ({} as the driver reports it; a MIG slice or a vGPU profile reports its share): the device's memory binds first, so the effective cap is {}",
            human_bytes(cap),
            self.bound_by(d),
            human_bytes(total),
            human_bytes(total)
        ));
    }
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;
    use std::sync::OnceLock;

    use vramshim_region::spec::parse_cap;
    use vramshim_trace::Api;

    use super::super::{Cap, ContextMode, DeviceQueries, Fault, Settings, wait::OnCap};

    thread_local! {
        static LINES: RefCell<Vec<String>> = const { RefCell::new(Vec::new()) };
    }
    fn capture(line: &str) {
        LINES.with(|l| l.borrow_mut().push(line.to_string()));
    }
    fn take_lines() -> Vec<String> {
        LINES.with(|l| std::mem::take(&mut *l.borrow_mut()))
    }
    /// A 20 GiB MIG slice as the driver reports it.
    fn slice(_: i32) -> Option<u64> {
        Some(20 << 30)
    }
    fn one() -> Option<i32> {
        Some(1)
    }
    fn none(_: i32) -> Option<u64> {
        None
    }
    fn no_uuid(_: i32) -> Option<[u8; 16]> {
        None
    }
    fn no_pools(_: i32, _: u64) -> Option<u64> {
        None
    }
    static QUERIES: OnceLock<DeviceQueries> = OnceLock::new();

    fn cap(text: &str, origin: &str) -> Cap {
        let _ = QUERIES.set(DeviceQueries {
            total: slice,
            count: one,
            process_used: none,
            uuid: no_uuid,
            settle_pools: no_pools,
        });
        Cap::new(
            Settings {
                spec: parse_cap(text).unwrap(),
                cap_text: None,
                shared: None,
                shared_invalid: None,
                context: ContextMode::Exclude,
                strict: false,
                fault: Fault::None,
                origin: std::array::from_fn(|_| Some(origin.to_string())),
                replaced: Vec::new(),
                dmem: Vec::new(),
                on_cap: OnCap::Fail,
            },
            &QUERIES,
            capture,
        )
    }

    /// A cap written for a whole 40 GiB GPU on a 20 GiB slice: one line naming the cap, its
    /// source and the slice's memory; the memory queries report the slice's total; a cap
    /// within the slice says nothing.
    #[test]
    fn a_cap_above_the_slice_is_said_once() {
        take_lines();
        let c = cap("40GiB", "CUDA_DEVICE_MEMORY_LIMIT=\"40g\"");
        c.try_charge(0, 1 << 30, Api::CudaMalloc).unwrap();
        c.try_charge(0, 1 << 30, Api::CudaMalloc).unwrap();
        let l: Vec<String> = take_lines()
            .into_iter()
            .filter(|l| l.contains("above the device's own memory"))
            .collect();
        assert_eq!(l.len(), 1, "{l:?}");
        assert!(
            l[0].contains("the cap of device 0 (40 GiB, set by CUDA_DEVICE_MEMORY_LIMIT=\"40g\") is above the device's own memory (20 GiB")
                && l[0].contains("effective cap is 20 GiB"),
            "{l:?}"
        );
        assert_eq!(c.total_for(0, 20 << 30), 20 << 30);
        let c = cap("8GiB", "VRAMSHIM_CAP=\"8GiB\"");
        c.try_charge(0, 1 << 30, Api::CudaMalloc).unwrap();
        let l = take_lines();
        assert!(!l.iter().any(|l| l.contains("above the device")), "{l:?}");
    }
}
