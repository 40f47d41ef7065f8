//! The `summary` text: what a person reads first.

use std::fmt::Write;

use crate::analysis::by_gpu::GpuGroup;
use crate::analysis::compare::Comparison;
use crate::analysis::{DeviceReport, PostMortem, TraceReport};
use crate::units::{bytes, duration_ns, wall_utc};

use super::one_line as line;

pub fn trace(r: &TraceReport, out: &mut String) {
    let _ = writeln!(out, "== {} ({})", line(&r.file), r.format);
    if r.process.pid != 0 || !r.process.cmdline.is_empty() {
        let _ = writeln!(
            out,
            "process {} (parent {}) on {}: {}",
            r.process.pid,
            r.process.ppid,
            if r.process.host.is_empty() {
                "?".into()
            } else {
                line(&r.process.host)
            },
            line(&r.process.cmdline.join(" "))
        );
    }
    let _ = writeln!(
        out,
        "{} events over {}, {} threads, {} distinct stacks",
        r.events,
        duration_ns(r.duration_ns),
        r.threads,
        r.stacks
    );
    for l in &r.cap_limits {
        let value = match (l.bytes, l.fraction) {
            (Some(b), _) => bytes(b),
            (None, Some(f)) => format!("{f} of the device"),
            (None, None) => "?".into(),
        };
        let _ = writeln!(
            out,
            "cap limit from {}: {} on {} ({})",
            l.origin(),
            value,
            l.devices_text(),
            line(&l.source)
        );
    }
    for w in &r.warnings {
        let _ = writeln!(out, "warning: {}", line(w));
    }
    for f in &r.failed_calls {
        let _ = writeln!(
            out,
            "CUDA call failed at +{}: {}",
            duration_ns(f.offset_ns),
            f.describe()
        );
    }
    for p in &r.pools {
        pool(p, out);
    }
    for d in &r.devices {
        device(d, out, end_note(r));
    }
}

/// The pool's last statistics on a device: what it holds and why.
fn pool(p: &crate::analysis::report::PoolReport, out: &mut String) {
    let budget = if p.budget == 0 {
        "no budget".to_string()
    } else {
        format!("budget {}", bytes(p.budget))
    };
    let _ = writeln!(
        out,
        "pool on device {} (last record): reserved {} (peak {}, {budget}), live {}, cached {}, pending {}, {} pages given back",
        p.device,
        bytes(p.reserved),
        bytes(p.peak_reserved),
        bytes(p.live),
        bytes(p.cached),
        bytes(p.pending),
        p.releases
    );
}

/// Why what is live at the end of the trace is not what the process left allocated, if so.
pub fn end_note(r: &TraceReport) -> Option<String> {
    match (r.cut_off, r.lost_events) {
        (false, 0) => None,
        (true, 0) => Some("the trace is cut off".into()),
        (false, n) => Some(format!("{n} events were lost")),
        (true, n) => Some(format!("the trace is cut off and {n} events were lost")),
    }
}

fn pct(f: f64) -> String {
    format!("{:.1}%", f * 100.0)
}

fn device(d: &DeviceReport, out: &mut String, end_note: Option<String>) {
    let _ = writeln!(out);
    let total = d
        .total_bytes
        .map(|t| format!(", {}", bytes(t)))
        .unwrap_or_default();
    let uuid = d
        .uuid
        .as_ref()
        .map(|u| format!(" ({u})"))
        .unwrap_or_default();
    let _ = writeln!(
        out,
        "-- {}{total}{uuid}",
        if d.device < 0 {
            "host (pinned) memory".to_string()
        } else {
            line(&d.name).into_owned()
        }
    );
    let _ = writeln!(
        out,
        "  allocations {} ({} failed, {} pooled), frees {}, {} allocated in total",
        d.allocs,
        d.failed_allocs,
        d.pooled_allocs,
        d.frees,
        bytes(d.bytes_allocated)
    );
    if d.retried_allocs > 0 {
        let _ = writeln!(
            out,
            "  retried by the runtime: {} (failed with CUDA_ERROR_INVALID_CONTEXT, no context \
             current yet, and the same request succeeded right after on the same thread: \
             the program never saw the failure; not counted as failed)",
            d.retried_allocs
        );
    }
    let p = &d.peak_in_use;
    let _ = writeln!(
        out,
        "  peak in use  {} at +{} (event {}, {} live allocations)",
        bytes(p.bytes),
        duration_ns(p.offset_ns),
        p.event_index,
        p.live_allocations
    );
    if let Some(r) = &d.peak_reserved {
        let _ = writeln!(
            out,
            "  peak reserved {} at +{} (in use then {}; fragmentation {})",
            bytes(r.bytes),
            duration_ns(r.offset_ns),
            bytes(r.in_use_bytes),
            d.fragmentation.map(pct).unwrap_or_else(|| "-".into())
        );
    }
    if let Some(c) = d.cap {
        let by = d
            .cap_source
            .as_ref()
            .map_or_else(String::new, |s| format!(" (set by {})", line(s)));
        let _ = writeln!(out, "  cap {}{by}: {} refusals", bytes(c), d.refusals);
    }
    if !d.calls.is_empty() {
        let _ = writeln!(out, "  calls:");
        for c in &d.calls {
            let _ = writeln!(
                out,
                "    {:<28} {:<5} {:>10} {:>12}{}",
                format!("{} ({})", c.api, c.kind),
                c.op,
                c.count,
                bytes(c.bytes),
                match (c.failed, c.retried) {
                    (0, 0) => String::new(),
                    (f, 0) => format!("  {f} failed"),
                    (0, r) => format!("  {r} retried by the runtime"),
                    (f, r) => format!("  {f} failed, {r} retried by the runtime"),
                }
            );
        }
    }
    if !p.top_sites.is_empty() {
        let _ = writeln!(out, "  held at the peak, by call site:");
        for s in &p.top_sites {
            let _ = writeln!(
                out,
                "    {:>12} in {:>6} allocations  {}",
                bytes(s.bytes),
                s.allocations,
                line(&s.site)
            );
        }
    }
    if let Some(t) = &d.torch_peak {
        let _ = writeln!(
            out,
            "  PyTorch's peak of allocated tensors at +{}:",
            duration_ns(t.offset_ns)
        );
        torch_view(t, "then", out);
    }
    if !p.top_allocations.is_empty() {
        let _ = writeln!(out, "  largest live allocations at the peak:");
        for h in p.top_allocations.iter().take(5) {
            let _ = writeln!(
                out,
                "    {:>12} at {} ({}, stream {:#x})  {}",
                bytes(h.size),
                h.addr,
                h.api,
                h.stream,
                line(&h.site)
            );
        }
    }
    if !d.size_histogram.is_empty() {
        let _ = writeln!(out, "  sizes (count, bytes):");
        for b in &d.size_histogram {
            let range = if b.max == 0 {
                "0".to_string()
            } else {
                format!("{}..{}", bytes(b.min), bytes(b.max.saturating_add(1)))
            };
            let _ = writeln!(
                out,
                "    {:<22} {:>10} {:>12}",
                range,
                b.count,
                bytes(b.bytes)
            );
        }
    }
    if d.frees > 0 {
        let _ = writeln!(out, "  lifetimes (freed allocations):");
        for l in d.lifetimes.iter().filter(|l| l.count > 0) {
            let _ = writeln!(
                out,
                "    {:<10} {:>10} {:>12}",
                l.label,
                l.count,
                bytes(l.bytes)
            );
        }
        let _ = writeln!(
            out,
            "  short-lived (< {}): {} ({}) {}; temporary (freed right after): {} ({})",
            duration_ns(d.short_lived.threshold_ns.unwrap_or(0)),
            d.short_lived.count,
            pct(d.short_lived.fraction),
            bytes(d.short_lived.bytes),
            d.temporary.count,
            pct(d.temporary.fraction)
        );
    }
    match end_note {
        None => {
            let _ = writeln!(
                out,
                "  at exit: {} in {} allocations still live",
                bytes(d.leaks.bytes),
                d.leaks.count
            );
        }
        Some(why) => {
            let _ = writeln!(
                out,
                "  at the end of the trace: {} in {} allocations live ({why}: frees after it are missing, so these are not leaks)",
                bytes(d.leaks.bytes),
                d.leaks.count
            );
        }
    }
    for s in d.leaks.top_sites.iter().take(5) {
        let _ = writeln!(
            out,
            "    {:>12} in {:>6} allocations  {}",
            bytes(s.bytes),
            s.allocations,
            line(&s.site)
        );
    }
    if !d.top_sites.is_empty() && d.top_sites.iter().any(|s| s.stack != 0) {
        let _ = writeln!(out, "  top call sites (peak bytes, allocations, bytes):");
        for s in &d.top_sites {
            let _ = writeln!(
                out,
                "    {:>12} {:>8} {:>12}  {}",
                bytes(s.peak_bytes),
                s.allocs,
                bytes(s.bytes),
                line(&s.site)
            );
        }
    }
    if d.unknown_frees > 0 || d.reused_addresses > 0 {
        let _ = writeln!(
            out,
            "  {} frees of addresses not seen allocated, {} addresses handed out again without a free",
            d.unknown_frees, d.reused_addresses
        );
    }
    if !d.syncs.is_empty() || d.pool_trims > 0 {
        let syncs: Vec<String> = d.syncs.iter().map(|(k, v)| format!("{k} {v}")).collect();
        let _ = writeln!(
            out,
            "  syncs: {}; pool trims {} ({})",
            if syncs.is_empty() {
                "none".into()
            } else {
                syncs.join(", ")
            },
            d.pool_trims,
            bytes(d.pool_trimmed_bytes)
        );
    }
    for (i, pm) in d.post_mortems.iter().enumerate() {
        post_mortem(i + 1, pm, out);
    }
    if d.post_mortems_not_shown > 0 {
        let _ = writeln!(
            out,
            "  ... and {} more refusals/OOMs not detailed",
            d.post_mortems_not_shown
        );
    }
}

/// PyTorch's tensors at one moment: by Python location, then the largest segments with what
/// lies in them and what is cached (free) inside them.
pub fn torch_view(t: &crate::analysis::torch::TorchView, when: &str, out: &mut String) {
    if let Some(f) = &t.failed {
        let _ = writeln!(
            out,
            "    PyTorch could not allocate {} at {} (device free: {})",
            bytes(f.size),
            line(&f.site),
            bytes(f.device_free)
        );
        for fr in f.frames.iter().take(6) {
            let _ = writeln!(out, "      {}", line(fr));
        }
    }
    let _ = writeln!(
        out,
        "    PyTorch {when}: {} allocated in {} tensors; {} reserved in {} segments, of which {} cached (free inside segments)",
        bytes(t.allocated),
        t.tensors,
        bytes(t.reserved),
        t.segments_total,
        bytes(t.cached)
    );
    if !t.holders.is_empty() {
        let _ = writeln!(out, "    tensors held, by Python line:");
        for h in &t.holders {
            let _ = writeln!(
                out,
                "      {:>12} in {:>6} tensors  {}",
                bytes(h.bytes),
                h.tensors,
                line(&h.site)
            );
        }
    }
    if !t.segments.is_empty() {
        let _ = writeln!(out, "    largest segments:");
        for sg in t.segments.iter().take(5) {
            let held: Vec<String> = sg
                .holders
                .iter()
                .take(3)
                .map(|h| format!("{} {}", bytes(h.bytes), line(&h.site)))
                .collect();
            let _ = writeln!(
                out,
                "      {} {:>10}: {} live{}{}, {} cached",
                sg.addr,
                bytes(sg.size),
                bytes(sg.allocated),
                if held.is_empty() { "" } else { " (" },
                if held.is_empty() {
                    String::new()
                } else {
                    held.join(", ") + ")"
                },
                bytes(sg.cached)
            );
        }
    }
}

pub fn post_mortem(n: usize, pm: &PostMortem, out: &mut String) {
    let _ = writeln!(out);
    let what = match pm.cause.as_str() {
        "cap" => "REFUSED by the cap",
        "pytorch" => "OUT OF MEMORY (PyTorch)",
        _ => "OUT OF MEMORY (device)",
    };
    let _ = writeln!(
        out,
        "  post-mortem #{n}: {} of {} {what} at +{} (event {})",
        pm.api,
        bytes(pm.size),
        duration_ns(pm.offset_ns),
        pm.event_index
    );
    if !pm.frames.is_empty() {
        let _ = writeln!(out, "    from {}", line(&pm.site));
    }
    let mut state = format!(
        "    live then: {} in {} allocations",
        bytes(pm.in_use),
        pm.live_allocations
    );
    if let Some(r) = pm.reserved {
        let _ = write!(
            state,
            "; reserved {} (cached {})",
            bytes(r),
            bytes(pm.cached.unwrap_or(0))
        );
    }
    if let Some(c) = pm.cap {
        let _ = write!(state, "; cap {} (charged {})", bytes(c), bytes(pm.charged));
        if let Some(s) = &pm.cap_source {
            let _ = write!(state, ", set by {}", line(s));
        }
    }
    if let Some(t) = pm.device_total {
        let _ = write!(state, "; device {}", bytes(t));
    }
    let _ = writeln!(out, "{state}");
    for s in pm.top_sites.iter().take(5) {
        let _ = writeln!(
            out,
            "      {:>12} in {:>6} allocations  {}",
            bytes(s.bytes),
            s.allocations,
            line(&s.site)
        );
    }
    if let Some(t) = &pm.torch {
        torch_view(t, "at the failure", out);
    }
    if let Some(l) = &pm.larger_cap {
        let _ = writeln!(
            out,
            "    a cap of {} ({} more) would have served it",
            bytes(l.needed_bytes),
            bytes(l.extra_bytes)
        );
    }
    if let Some(l) = &pm.larger_device
        && l.extra_bytes > 0
    {
        let _ = writeln!(
            out,
            "    it needed a device of at least {} ({} more)",
            bytes(l.needed_bytes),
            bytes(l.extra_bytes)
        );
    }
    if let Some(s) = &pm.stitch {
        let verdict = match s.served {
            Some(true) => "stitch WOULD have served it",
            Some(false) => "stitch would NOT have served it either",
            None => "stitch: not judged",
        };
        let _ = writeln!(out, "    {verdict}: {}", s.detail);
    }
}

pub fn comparison(c: &Comparison, out: &mut String) {
    let _ = writeln!(out, "== {} traces side by side", c.rows.len());
    let _ = writeln!(
        out,
        "  {:<32} {:>8} {:>10} {:>12} {:>12} {:>12} {:>8}",
        "file", "pid", "allocs", "allocated", "peak in use", "peak reserv", "refused"
    );
    for r in &c.rows {
        let name = std::path::Path::new(&r.file)
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let _ = writeln!(
            out,
            "  {:<32} {:>8} {:>10} {:>12} {:>12} {:>12} {:>8}",
            line(&name),
            r.pid,
            r.allocs,
            bytes(r.bytes_allocated),
            bytes(r.peak_in_use),
            r.peak_reserved.map(bytes).unwrap_or_else(|| "-".into()),
            // a cap refusal is also its allocation's out-of-memory result: counted once
            r.refusals.max(r.ooms)
        );
    }
    let _ = writeln!(out, "  median peak in use {}", bytes(c.median_peak_in_use));
    if c.outliers.is_empty() {
        let _ = writeln!(out, "  no outliers (all within 10% of the median)");
    }
    for o in &c.outliers {
        let _ = writeln!(
            out,
            "  OUTLIER {}: {} {} is {:+.1}% from the median {}",
            line(&o.file),
            o.metric.replace('_', " "),
            bytes(o.value),
            o.deviation * 100.0,
            bytes(o.median)
        );
    }
}

/// GPUs several traces shared: who held what at their combined peak and at each refusal.
pub fn by_gpu(groups: &[GpuGroup], out: &mut String) {
    let _ = writeln!(
        out,
        "== by GPU: the traces lined up by device UUID and wall clock"
    );
    for g in groups {
        let total = g
            .total_bytes
            .map(|t| format!(", {}", bytes(t)))
            .unwrap_or_default();
        let _ = writeln!(
            out,
            "{} ({}{total}): {} processes",
            g.uuid,
            line(&g.name),
            g.processes.len()
        );
        let who = |k: usize| {
            let m = &g.processes[k];
            let file = std::path::Path::new(&m.trace)
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_else(|| m.trace.clone());
            format!("pid {} ({}, device {})", m.pid, line(&file), m.device)
        };
        for (k, m) in g.processes.iter().enumerate() {
            let _ = writeln!(out, "  {}: peak in use {}", who(k), bytes(m.peak_in_use));
        }
        let held = |h: &[u64]| {
            h.iter()
                .enumerate()
                .map(|(k, b)| format!("pid {} {}", g.processes[k].pid, bytes(*b)))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let p = &g.combined_peak;
        let _ = writeln!(
            out,
            "  together at most {} at {}: {}",
            bytes(p.bytes),
            wall_utc(p.wall_ns),
            held(&p.held)
        );
        for f in &g.failures {
            let others: u64 = f
                .held
                .iter()
                .enumerate()
                .filter(|(k, _)| *k != f.process)
                .map(|(_, b)| b)
                .sum();
            let _ = writeln!(
                out,
                "  {} {} asking {} at {}: it held {}, the others {} ({})",
                who(f.process),
                if f.cause == "cap" {
                    "refused by the cap"
                } else {
                    "out of device memory"
                },
                bytes(f.size),
                wall_utc(f.wall_ns),
                bytes(f.held[f.process]),
                bytes(others),
                held(&f.held)
            );
            if let Some(t) = g.total_bytes {
                let traced: u64 = f.held.iter().sum();
                if traced < t {
                    let _ = writeln!(
                        out,
                        "    of the {} card, {} were not in these traces (CUDA contexts, processes not traced)",
                        bytes(t),
                        bytes(t - traced)
                    );
                }
            }
        }
    }
}
