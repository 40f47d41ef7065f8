//! `vramshim report`: one self-contained HTML page (inline CSS and SVG, no script, no network).

use std::fmt::Write;

use crate::analysis::compare::Comparison;
use crate::analysis::timeline::Timeline;
use crate::analysis::{DeviceReport, TraceReport};
use crate::units::{bytes, duration_ns};

/// Text for the page: markup characters as entities (quotes included, so the same text is
/// safe inside an attribute), and the characters the terminal output escapes (controls, the
/// bidirectional overrides, isolates and marks, the line separators) written visibly as their
/// escape (`\u{202e}`), line breaks and tabs aside: a browser applies a right-to-left override
/// as a terminal does, so a name a trace carries could otherwise show reversed and pass for
/// another, and an entity (`&#x202e;`) would be applied all the same.
pub fn esc(s: &str) -> String {
    let s = crate::terminal::for_terminal(s);
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '&' => o.push_str("&amp;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&#39;"),
            c => o.push(c),
        }
    }
    o
}

const CSS: &str = r#"
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0;background:#f6f7f9;color:#1d2330}
header{background:#1d2330;color:#fff;padding:18px 28px}header h1{margin:0;font-size:20px}header p{margin:4px 0 0;color:#c7cbd6}
main{padding:12px 28px 40px;max-width:1100px}
section{background:#fff;border:1px solid #dde1e8;border-radius:8px;padding:14px 18px;margin:16px 0}
h2{font-size:17px;margin:0 0 10px}h3{font-size:15px;margin:14px 0 6px}
table{border-collapse:collapse;font-size:13px}td,th{padding:3px 10px 3px 0;text-align:left;vertical-align:top}
th{color:#5b6475;font-weight:600}td.n{text-align:right;font-variant-numeric:tabular-nums}
.kpis{display:flex;flex-wrap:wrap;gap:10px}.kpi{border:1px solid #dde1e8;border-radius:6px;padding:8px 12px;min-width:130px}
.kpi b{display:block;font-size:18px}.kpi span{color:#5b6475;font-size:12px}
.warn{color:#9a3412}.bad{color:#b91c1c;font-weight:600}.ok{color:#15803d;font-weight:600}
svg.chart{display:block;max-width:100%;height:auto}svg text{font:11px system-ui,sans-serif;fill:#5b6475}
.legend span{display:inline-block;margin-right:14px;font-size:12px}.sw{display:inline-block;width:10px;height:10px;margin-right:4px;vertical-align:middle}
.pm{border-left:4px solid #b91c1c;padding:6px 12px;margin:10px 0;background:#fef2f2}
code{font:12px ui-monospace,Menlo,monospace}
"#;

const W: f64 = 960.0;

fn axis_ticks(max: f64, n: usize) -> Vec<f64> {
    if max <= 0.0 {
        return vec![0.0];
    }
    let raw = max / n as f64;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 2.5, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|s| *s >= raw)
        .unwrap_or(raw);
    (0..=n + 1)
        .map(|i| i as f64 * step)
        .take_while(|v| *v <= max * 1.0001)
        .collect()
}

fn byte_ticks(max: u64) -> Vec<u64> {
    // Ticks at round binary sizes.
    if max == 0 {
        return vec![0];
    }
    let unit = [1u64 << 40, 1 << 30, 1 << 20, 1 << 10, 1]
        .into_iter()
        .find(|u| max >= *u * 2)
        .unwrap_or(1);
    axis_ticks(max as f64 / unit as f64, 5)
        .into_iter()
        .map(|v| (v * unit as f64) as u64)
        .collect()
}

const PALETTE: [&str; 8] = [
    "#3b82f6", "#f59e0b", "#10b981", "#8b5cf6", "#ef4444", "#14b8a6", "#eab308", "#ec4899",
];

/// The plot area of the report's time charts, in the SVG's user units.
#[derive(Clone, Copy)]
struct Plot {
    ml: f64,
    mt: f64,
    pw: f64,
    ph: f64,
}

const PLOT_H: f64 = 280.0;
const PLOT: Plot = Plot {
    ml: 70.0,
    mt: 14.0,
    pw: W - 70.0 - 16.0,
    ph: PLOT_H - 14.0 - 34.0,
};

impl Plot {
    /// Opens the `<svg>` (with `attrs` and `label`) and draws the frame, the byte axis up to
    /// `ymax` and the time axis over `t_span` ns.
    fn frame(self, out: &mut String, attrs: &str, label: &str, ymax: f64, t_span: f64) {
        let Plot { ml, mt, pw, ph } = self;
        let _ = write!(
            out,
            r##"<svg {attrs} viewBox="0 0 {W} {PLOT_H}" role="img" aria-label="{label}"><rect x="{ml}" y="{mt}" width="{pw}" height="{ph}" fill="#fbfcfd" stroke="#dde1e8"/>"##
        );
        for v in byte_ticks(ymax as u64) {
            let yy = mt + ph - v as f64 / ymax * ph;
            let _ = write!(
                out,
                r##"<line x1="{ml}" x2="{}" y1="{yy:.1}" y2="{yy:.1}" stroke="#eef0f4"/><text x="{}" y="{:.1}" text-anchor="end">{}</text>"##,
                ml + pw,
                ml - 6.0,
                yy + 4.0,
                bytes(v)
            );
        }
        for tv in axis_ticks(t_span, 6) {
            let xx = ml + tv / t_span * pw;
            let _ = write!(
                out,
                r#"<text x="{xx:.1}" y="{}" text-anchor="middle">+{}</text>"#,
                mt + ph + 16.0,
                duration_ns(tv as u64)
            );
        }
    }
}

/// The processes of one shared GPU, stacked over wall-clock time, the card's size, and a
/// mark at every refused allocation.
fn shared_gpu_svg(g: &crate::analysis::by_gpu::GpuGroup, out: &mut String) {
    let (slice, samples) = g.samples(800);
    let (Some(first), Some(last)) = (samples.first(), samples.last()) else {
        return;
    };
    let Plot { ml, mt, pw, ph } = PLOT;
    let t0 = first.0;
    let t_end = last.0 + slice;
    let t_span = (t_end - t0).max(1) as f64;
    let data_max = samples
        .iter()
        .map(|s| s.1.iter().sum::<u64>())
        .max()
        .unwrap_or(0);
    let card = g
        .total_bytes
        .filter(|&t| data_max == 0 || t / CAP_ABOVE_RATIO <= data_max);
    let ymax = (data_max.max(card.unwrap_or(0)) as f64 * 1.05).max(1.0);
    let x = |t: u64| ml + t.saturating_sub(t0) as f64 / t_span * pw;
    let y = |v: u64| mt + ph - v as f64 / ymax * ph;
    PLOT.frame(
        out,
        r#"class="chart shared-gpu""#,
        "processes on one GPU over time",
        ymax,
        t_span,
    );
    // Band k lies between the sum of processes 0..k and 0..=k.
    let mut below = vec![0u64; samples.len()];
    for k in 0..g.processes.len() {
        let above: Vec<u64> = samples
            .iter()
            .zip(&below)
            .map(|(s, b)| b + s.1.get(k).copied().unwrap_or(0))
            .collect();
        let mut d = String::new();
        for (j, s) in samples.iter().enumerate() {
            let x1 = samples.get(j + 1).map_or(t_end, |n| n.0);
            let _ = write!(
                d,
                "{}{:.1},{:.1}L{:.1},{:.1}",
                if j == 0 { "M" } else { "L" },
                x(s.0),
                y(above[j]),
                x(x1),
                y(above[j])
            );
        }
        for (j, s) in samples.iter().enumerate().rev() {
            let x1 = samples.get(j + 1).map_or(t_end, |n| n.0);
            let _ = write!(
                d,
                "L{:.1},{:.1}L{:.1},{:.1}",
                x(x1),
                y(below[j]),
                x(s.0),
                y(below[j])
            );
        }
        let p = &g.processes[k];
        let _ = write!(
            out,
            r##"<path class="process" d="{d}Z" fill="{c}" fill-opacity="0.55" stroke="{c}" stroke-width="1"><title>pid {} ({}): peak {}</title></path>"##,
            p.pid,
            esc(&p.trace),
            bytes(p.peak_in_use),
            c = PALETTE[k % PALETTE.len()],
        );
        below = above;
    }
    if let Some(t) = card {
        let yy = y(t);
        let _ = write!(
            out,
            r##"<line class="card" x1="{ml}" x2="{}" y1="{yy:.1}" y2="{yy:.1}" stroke="#111827" stroke-dasharray="4 3"><title>the card: {}</title></line>"##,
            ml + pw,
            bytes(t)
        );
    }
    for f in &g.failures {
        let xx = x(f.wall_ns);
        let _ = write!(
            out,
            r##"<path class="mark {}" d="M{xx:.1},{}l-5,-9h10z" fill="#b91c1c"><title>pid {}: {} of {} at {}</title></path><line x1="{xx:.1}" x2="{xx:.1}" y1="{mt}" y2="{}" stroke="#b91c1c" stroke-opacity="0.35"/>"##,
            if f.cause == "cap" { "refusal" } else { "oom" },
            mt + 10.0,
            g.processes[f.process].pid,
            if f.cause == "cap" {
                "cap refusal"
            } else {
                "out of memory"
            },
            bytes(f.size),
            crate::units::wall_utc(f.wall_ns),
            mt + ph
        );
    }
    out.push_str("</svg><div class=\"legend\">");
    for (k, p) in g.processes.iter().enumerate() {
        let _ = write!(
            out,
            r#"<span><i class="sw" style="background:{}"></i>pid {}</span>"#,
            PALETTE[k % PALETTE.len()],
            p.pid
        );
    }
    let _ = write!(
        out,
        r#"<span><i class="sw" style="background:#111827"></i>the card</span><span><i class="sw" style="background:#b91c1c"></i>refusals and OOMs</span><span>from {}</span></div>"#,
        crate::units::wall_utc(t0)
    );
}

/// How far above the data a cap may be before the chart's axis stops including it.
const CAP_ABOVE_RATIO: u64 = 4;

/// Memory over time: in-use band (min..max per bucket), reserved, cap, refusal/OOM marks.
pub fn timeline_svg(tl: &Timeline, cap: Option<u64>, id: &str, out: &mut String) {
    let pts = tl.points();
    let Plot { ml, mt, pw, ph } = PLOT;
    let t_end = pts
        .last()
        .map(|p| p.t_ns + tl.width_ns)
        .unwrap_or(tl.t0 + 1);
    let t_span = (t_end - tl.t0).max(1) as f64;
    let data_max = pts
        .iter()
        .map(|p| p.in_max.max(p.reserved.unwrap_or(0)))
        .max()
        .unwrap_or(0);
    let cap_max = tl.caps.iter().map(|c| c.1).chain(cap).max().unwrap_or(0);
    // A cap far above what the process used would squeeze its curves into a sliver at the
    // bottom: the axis then follows the data and the cap is drawn along the top edge,
    // labelled as above the chart.
    let cap_above = data_max > 0 && cap_max / CAP_ABOVE_RATIO > data_max;
    let ymax = if cap_above {
        data_max as f64 * 1.15
    } else {
        (data_max.max(cap_max) as f64 * 1.05).max(1.0)
    };
    let x = |t: u64| ml + (t.saturating_sub(tl.t0)) as f64 / t_span * pw;
    let y = |v: u64| mt + ph - v as f64 / ymax * ph;
    PLOT.frame(
        out,
        &format!(r#"class="chart timeline" id="{id}""#),
        "memory over time",
        ymax,
        t_span,
    );
    if !pts.is_empty() {
        // In-use band: max along the top, min back along the bottom.
        let mut d = String::with_capacity(pts.len() * 24);
        for (i, p) in pts.iter().enumerate() {
            let _ = write!(
                d,
                "{}{:.1},{:.1}",
                if i == 0 { "M" } else { "L" },
                x(p.t_ns),
                y(p.in_max)
            );
            let _ = write!(d, "L{:.1},{:.1}", x(p.t_ns + tl.width_ns), y(p.in_max));
        }
        for p in pts.iter().rev() {
            let _ = write!(
                d,
                "L{:.1},{:.1}L{:.1},{:.1}",
                x(p.t_ns + tl.width_ns),
                y(p.in_min),
                x(p.t_ns),
                y(p.in_min)
            );
        }
        let _ = write!(
            out,
            r##"<path class="in-use" d="{d}Z" fill="#3b82f6" fill-opacity="0.35" stroke="#2563eb" stroke-width="1"><title>in use</title></path>"##
        );
        if pts.iter().any(|p| p.reserved.is_some()) {
            let mut d = String::new();
            let mut first = true;
            for p in &pts {
                if let Some(r) = p.reserved {
                    let _ = write!(
                        d,
                        "{}{:.1},{:.1}L{:.1},{:.1}",
                        if first { "M" } else { "L" },
                        x(p.t_ns),
                        y(r),
                        x(p.t_ns + tl.width_ns),
                        y(r)
                    );
                    first = false;
                }
            }
            let _ = write!(
                out,
                r##"<path class="reserved" d="{d}" fill="none" stroke="#f59e0b" stroke-width="1.5"><title>reserved</title></path>"##
            );
        }
    }
    let mut caps: Vec<(u64, u64)> = tl.caps.clone();
    if caps.is_empty()
        && let Some(c) = cap
    {
        caps.push((tl.t0, c));
    }
    for (i, (t, c)) in caps.iter().enumerate() {
        let t1 = caps.get(i + 1).map(|n| n.0).unwrap_or(t_end);
        let above = *c as f64 > ymax;
        let yc = if above { mt } else { y(*c) };
        let _ = write!(
            out,
            r##"<line class="cap" x1="{:.1}" x2="{:.1}" y1="{yc:.1}" y2="{yc:.1}" stroke="#b91c1c" stroke-dasharray="6 4" stroke-width="1.5"><title>cap {}</title></line>"##,
            x(*t).min(ml + pw),
            x(t1),
            bytes(*c)
        );
        if above {
            let _ = write!(
                out,
                r##"<text class="cap-above" x="{:.1}" y="{:.1}" text-anchor="end" fill="#b91c1c">cap {} (above the chart)</text>"##,
                x(t1) - 4.0,
                mt + 14.0,
                bytes(*c)
            );
        }
    }
    for m in &tl.marks {
        let xx = x(m.t_ns);
        let _ = write!(
            out,
            r##"<path class="mark {}" d="M{:.1},{}l-5,-9h10z" fill="#b91c1c"><title>{} of {} at +{}</title></path><line x1="{xx:.1}" x2="{xx:.1}" y1="{mt}" y2="{}" stroke="#b91c1c" stroke-opacity="0.35"/>"##,
            m.kind,
            xx,
            mt + 10.0,
            if m.kind == "oom" {
                "out of memory"
            } else {
                "cap refusal"
            },
            bytes(m.size),
            duration_ns(m.t_ns.saturating_sub(tl.t0)),
            mt + ph
        );
    }
    out.push_str("</svg>");
    out.push_str(r##"<div class="legend"><span><i class="sw" style="background:#3b82f6;opacity:.5"></i>in use (min..max per bucket)</span><span><i class="sw" style="background:#f59e0b"></i>reserved</span><span><i class="sw" style="background:#b91c1c"></i>cap / refusals and OOMs</span></div>"##);
}

/// Horizontal bars: (label, value, tooltip).
pub fn hbars(rows: &[(String, u64, String)], class: &str, out: &mut String) {
    if rows.is_empty() {
        out.push_str("<p>none</p>");
        return;
    }
    let row_h = 22.0;
    let label_w = 340.0;
    let h = rows.len() as f64 * row_h + 8.0;
    let max = rows.iter().map(|r| r.1).max().unwrap_or(1).max(1) as f64;
    let bw = W - label_w - 110.0;
    let _ = write!(out, r#"<svg class="chart {class}" viewBox="0 0 {W} {h}">"#);
    for (i, (label, v, tip)) in rows.iter().enumerate() {
        let yy = 4.0 + i as f64 * row_h;
        let w = (*v as f64 / max * bw).max(1.0);
        let short: String = if label.chars().count() > 52 {
            format!("{}...", label.chars().take(50).collect::<String>())
        } else {
            label.clone()
        };
        let _ = write!(
            out,
            r##"<g class="bar"><title>{}</title><text x="{}" y="{:.1}" text-anchor="end">{}</text><rect x="{label_w}" y="{yy:.1}" width="{w:.1}" height="{}" fill="#6366f1" rx="2"/><text x="{:.1}" y="{:.1}">{}</text></g>"##,
            esc(tip),
            label_w - 8.0,
            yy + 14.0,
            esc(&short),
            row_h - 6.0,
            label_w + w + 6.0,
            yy + 14.0,
            bytes(*v)
        );
    }
    out.push_str("</svg>");
}

fn histogram_svg(d: &DeviceReport, out: &mut String) {
    let b = &d.size_histogram;
    if b.is_empty() {
        out.push_str("<p>no allocations</p>");
        return;
    }
    let (h, ml, mb, mt) = (220.0, 50.0, 46.0, 10.0);
    let ph = h - mb - mt;
    let n = b.len() as f64;
    let slot = (W - ml - 10.0) / n;
    let maxc = b.iter().map(|x| x.count).max().unwrap_or(1).max(1) as f64;
    let maxb = b.iter().map(|x| x.bytes).max().unwrap_or(1).max(1) as f64;
    let _ = write!(
        out,
        r#"<svg class="chart histogram" viewBox="0 0 {W} {h}">"#
    );
    for (i, x) in b.iter().enumerate() {
        let x0 = ml + i as f64 * slot;
        let hc = x.count as f64 / maxc * ph;
        let hb = x.bytes as f64 / maxb * ph;
        let label = if x.max == 0 {
            "0".to_string()
        } else {
            bytes(x.min)
        };
        let _ = write!(
            out,
            r##"<g class="bucket"><title>{}..{}: {} allocations, {}</title><rect x="{:.1}" y="{:.1}" width="{:.1}" height="{hc:.1}" fill="#6366f1"/><rect x="{:.1}" y="{:.1}" width="{:.1}" height="{hb:.1}" fill="#10b981"/><text x="{:.1}" y="{:.1}" text-anchor="end" transform="rotate(-45 {:.1} {:.1})">{}</text></g>"##,
            bytes(x.min),
            bytes(x.max.saturating_add(1)),
            x.count,
            bytes(x.bytes),
            x0 + 1.0,
            mt + ph - hc,
            slot * 0.45,
            x0 + slot * 0.48,
            mt + ph - hb,
            slot * 0.45,
            x0 + slot * 0.5,
            h - mb + 14.0,
            x0 + slot * 0.5,
            h - mb + 14.0,
            label
        );
    }
    out.push_str("</svg>");
    out.push_str(r##"<div class="legend"><span><i class="sw" style="background:#6366f1"></i>allocations (count)</span><span><i class="sw" style="background:#10b981"></i>bytes</span></div>"##);
}

fn kpi(out: &mut String, label: &str, value: &str) {
    let _ = write!(
        out,
        r#"<div class="kpi"><b>{}</b><span>{}</span></div>"#,
        esc(value),
        esc(label)
    );
}

fn device(r: &TraceReport, d: &DeviceReport, out: &mut String) {
    let id = if d.device < 0 {
        "host".to_string()
    } else {
        format!("dev{}", d.device)
    };
    let _ = write!(
        out,
        r#"<section class="device" id="{id}"><h2>{}{}</h2><div class="kpis">"#,
        esc(&if d.device < 0 {
            "host (pinned) memory".into()
        } else {
            d.name.clone()
        }),
        d.uuid
            .as_ref()
            .map(|u| format!(r#" <span class="uuid">{}</span>"#, esc(u)))
            .unwrap_or_default()
    );
    kpi(
        out,
        &format!("peak in use at +{}", duration_ns(d.peak_in_use.offset_ns)),
        &bytes(d.peak_in_use.bytes),
    );
    if let Some(p) = &d.peak_reserved {
        kpi(out, "peak reserved", &bytes(p.bytes));
    }
    if let Some(f) = d.fragmentation {
        kpi(
            out,
            "fragmentation at peak reserved",
            &format!("{:.1}%", f * 100.0),
        );
    }
    if let Some(c) = d.cap {
        kpi(out, "cap", &bytes(c));
    }
    kpi(out, "allocations", &d.allocs.to_string());
    kpi(out, "allocated in total", &bytes(d.bytes_allocated));
    kpi(
        out,
        "refusals + OOMs",
        &(d.refusals.max(d.ooms)).to_string(),
    );
    // A cut-off trace, or one with lost events, does not show what the process left
    // allocated at exit.
    let live_label = if super::text::end_note(r).is_some() {
        "live at the end of the incomplete trace (not leaks)"
    } else {
        "live at exit"
    };
    kpi(out, live_label, &bytes(d.leaks.bytes));
    out.push_str("</div><h3>Memory over time</h3>");
    if let Some((_, tl)) = r.timelines.iter().find(|(dev, _)| *dev == d.device) {
        timeline_svg(tl, d.cap, &format!("timeline-{id}"), out);
    }
    out.push_str("<h3>Live set at the peak (by call site)</h3>");
    let rows: Vec<(String, u64, String)> = d
        .peak_in_use
        .top_sites
        .iter()
        .map(|s| {
            (
                s.site.clone(),
                s.bytes,
                format!("{} in {} allocations", s.site, s.allocations),
            )
        })
        .collect();
    hbars(&rows, "live-at-peak", out);
    if !d.peak_in_use.top_allocations.is_empty() {
        out.push_str("<table class=\"largest\"><tr><th>size</th><th>address</th><th>api</th><th>stream</th><th>site</th></tr>");
        for h in &d.peak_in_use.top_allocations {
            let _ = write!(
                out,
                "<tr><td class=n>{}</td><td><code>{}</code></td><td>{}</td><td><code>{:#x}</code></td><td>{}</td></tr>",
                bytes(h.size),
                esc(&h.addr),
                esc(&h.api),
                h.stream,
                esc(&h.site)
            );
        }
        out.push_str("</table>");
    }
    if let Some(t) = &d.torch_peak {
        let _ = write!(
            out,
            "<h3>PyTorch's tensors at their peak (+{})</h3>",
            duration_ns(t.offset_ns)
        );
        torch_tables(t, out);
    }
    out.push_str("<h3>Allocation sizes</h3>");
    histogram_svg(d, out);
    out.push_str("<h3>Top call sites (bytes allocated)</h3>");
    let rows: Vec<(String, u64, String)> = d
        .top_sites
        .iter()
        .map(|s| {
            (
                s.site.clone(),
                s.bytes,
                format!(
                    "{} allocations; at peak {}; frames: {}",
                    s.allocs,
                    bytes(s.peak_bytes),
                    s.frames.join(" <- ")
                ),
            )
        })
        .collect();
    hbars(&rows, "sites", out);
    out.push_str("<h3>Calls</h3><table class=\"calls\"><tr><th>api</th><th>kind</th><th>op</th><th>count</th><th>failed</th><th>bytes</th></tr>");
    for c in &d.calls {
        let _ = write!(
            out,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td class=n>{}</td><td class=n>{}</td><td class=n>{}</td></tr>",
            esc(&c.api),
            esc(&c.kind),
            c.op,
            c.count,
            c.failed,
            bytes(c.bytes)
        );
    }
    out.push_str("</table>");
    if d.frees > 0 {
        out.push_str("<h3>Lifetimes</h3><table class=\"lifetimes\"><tr><th>lifetime</th><th>count</th><th>bytes</th></tr>");
        for l in d.lifetimes.iter().filter(|l| l.count > 0) {
            let _ = write!(
                out,
                "<tr><td>{}</td><td class=n>{}</td><td class=n>{}</td></tr>",
                l.label,
                l.count,
                bytes(l.bytes)
            );
        }
        let _ = write!(
            out,
            "</table><p>Short-lived (&lt; {}): {} allocations ({:.1}%), {}. Temporary (freed right after): {}.</p>",
            duration_ns(d.short_lived.threshold_ns.unwrap_or(0)),
            d.short_lived.count,
            d.short_lived.fraction * 100.0,
            bytes(d.short_lived.bytes),
            d.temporary.count
        );
    }
    if !d.post_mortems.is_empty() {
        let _ = write!(
            out,
            "<h3 class=bad>Post-mortems ({})</h3>",
            d.post_mortems.len()
        );
        for (i, pm) in d.post_mortems.iter().enumerate() {
            let mut text = String::new();
            super::text::post_mortem(i + 1, pm, &mut text);
            let _ = write!(
                out,
                "<div class=\"pm post-mortem\"><pre>{}</pre>",
                esc(text.trim_matches('\n'))
            );
            let rows: Vec<(String, u64, String)> = pm
                .top_sites
                .iter()
                .map(|s| {
                    (
                        s.site.clone(),
                        s.bytes,
                        format!("{} allocations", s.allocations),
                    )
                })
                .collect();
            hbars(&rows, "pm-live", out);
            if let Some(t) = &pm.torch {
                out.push_str("<h4>PyTorch's tensors at the failure</h4>");
                torch_tables(t, out);
            }
            out.push_str("</div>");
        }
    }
    out.push_str("</section>");
}

/// PyTorch's tensors at one moment: a table by Python line (with its frames), and the
/// largest segments with what lies in them and what is cached inside them.
fn torch_tables(t: &crate::analysis::torch::TorchView, out: &mut String) {
    let _ = write!(
        out,
        "<p>{} allocated in {} tensors; {} reserved in {} segments, of which <b>{} cached</b> (free inside segments).</p>",
        bytes(t.allocated),
        t.tensors,
        bytes(t.reserved),
        t.segments_total,
        bytes(t.cached)
    );
    if let Some(f) = &t.failed {
        let _ = write!(
            out,
            "<p class=bad>PyTorch could not allocate {} at <code>{}</code> (device free: {}).</p>",
            bytes(f.size),
            esc(&f.site),
            bytes(f.device_free)
        );
    }
    out.push_str("<table class=\"torch-holders\"><tr><th>bytes</th><th>tensors</th><th>Python line</th><th>stack</th></tr>");
    for h in &t.holders {
        let _ = write!(
            out,
            "<tr><td class=n>{}</td><td class=n>{}</td><td><code>{}</code></td><td>{}</td></tr>",
            bytes(h.bytes),
            h.tensors,
            esc(&h.site),
            esc(&h.frames.join(" <- "))
        );
    }
    out.push_str("</table><table class=\"torch-segments\"><tr><th>segment</th><th>size</th><th>live</th><th>cached</th><th>held by</th></tr>");
    for sg in &t.segments {
        let held: Vec<String> = sg
            .holders
            .iter()
            .map(|h| format!("{} {}", bytes(h.bytes), h.site))
            .collect();
        let _ = write!(
            out,
            "<tr><td><code>{}</code></td><td class=n>{}</td><td class=n>{}</td><td class=n>{}</td><td>{}</td></tr>",
            esc(&sg.addr),
            bytes(sg.size),
            bytes(sg.allocated),
            bytes(sg.cached),
            esc(&held.join("; "))
        );
    }
    out.push_str("</table>");
}

/// The whole page for one or more traces.
pub fn page(
    reports: &[TraceReport],
    comparison: Option<&Comparison>,
    gpus: &[crate::analysis::by_gpu::GpuGroup],
) -> String {
    let mut out = String::with_capacity(256 << 10);
    let title = reports
        .iter()
        .map(|r| r.label())
        .collect::<Vec<_>>()
        .join(", ");
    let _ = write!(
        out,
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><meta name=\"viewport\" content=\"width=device-width\"><title>vramshim report: {}</title><style>{CSS}</style></head><body><header><h1>vramshim report</h1><p>{}</p></header><main>",
        esc(&title),
        esc(&title)
    );
    if let Some(c) = comparison {
        let mut text = String::new();
        super::text::comparison(c, &mut text);
        let _ = write!(
            out,
            "<section class=\"comparison\"><h2>Side by side</h2><pre>{}</pre></section>",
            esc(&text)
        );
    }
    if !gpus.is_empty() {
        out.push_str("<section class=\"by-gpu\"><h2>By GPU: processes that shared a GPU</h2>");
        for g in gpus {
            let _ = write!(
                out,
                "<h3>{} <span class=\"uuid\">{}</span></h3>",
                esc(&g.name),
                esc(&g.uuid)
            );
            shared_gpu_svg(g, &mut out);
            let mut text = String::new();
            super::text::by_gpu(std::slice::from_ref(g), &mut text);
            let _ = write!(
                out,
                "<pre style=\"white-space:pre-wrap\">{}</pre>",
                esc(&text)
            );
        }
        out.push_str("</section>");
    }
    for r in reports {
        let _ = write!(
            out,
            "<section class=\"trace\"><h2>{}</h2><table>",
            esc(&r.file)
        );
        let row = |out: &mut String, k: &str, v: &str| {
            let _ = write!(out, "<tr><th>{}</th><td>{}</td></tr>", esc(k), esc(v));
        };
        if r.process.pid != 0 {
            row(
                &mut out,
                "process",
                &format!(
                    "{} on {}: {}",
                    r.process.pid,
                    r.process.host,
                    r.process.cmdline.join(" ")
                ),
            );
        }
        row(&mut out, "format", &r.format);
        row(&mut out, "events", &r.events.to_string());
        row(&mut out, "duration", &duration_ns(r.duration_ns));
        row(&mut out, "threads", &r.threads.to_string());
        for (k, v) in &r.config {
            row(&mut out, k, v);
        }
        out.push_str("</table>");
        for w in &r.warnings {
            let _ = write!(out, "<p class=warn>warning: {}</p>", esc(w));
        }
        for f in &r.failed_calls {
            let _ = write!(
                out,
                "<p class=warn>CUDA call failed at +{}: {}</p>",
                esc(&duration_ns(f.offset_ns)),
                esc(&f.describe())
            );
        }
        out.push_str("</section>");
        for d in &r.devices {
            device(r, d, &mut out);
        }
    }
    out.push_str("<footer><p>Generated by vramshim. Self-contained: no scripts, no network.</p></footer></main></body></html>\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The in-use band's highest point (smallest y) in the SVG path of class `in-use`.
    fn in_use_top(svg: &str) -> f64 {
        let d = svg.split("class=\"in-use\" d=\"").nth(1).unwrap();
        let d = &d[..d.find('"').unwrap()];
        d.split(['M', 'L', 'Z'])
            .filter_map(|p| p.split(',').nth(1)?.parse::<f64>().ok())
            .fold(f64::MAX, f64::min)
    }

    fn timeline(cap: u64) -> String {
        let mut tl = Timeline::new(0, 16);
        for i in 0..16u64 {
            tl.in_use(i * 1000, (1 << 30) + i * (1 << 20));
        }
        tl.cap(0, cap);
        let mut out = String::new();
        timeline_svg(&tl, Some(cap), "t", &mut out);
        out
    }

    /// Markup and quotes become entities; controls and reordering characters show as their
    /// escape (an entity would still be applied); the page's own line breaks stay.
    #[test]
    fn text_is_escaped_for_the_page() {
        assert_eq!(
            esc("<a href='x'>\"&</a>"),
            "&lt;a href=&#39;x&#39;&gt;&quot;&amp;&lt;/a&gt;"
        );
        assert_eq!(
            esc("train\u{202e}yp.evil\u{1b}[2J\u{2066}\n\tx"),
            "train\\u{202e}yp.evil\\u{1b}[2J\\u{2066}\n\tx"
        );
        assert_eq!(esc("plain 训练 Ä"), "plain 训练 Ä");
    }

    #[test]
    fn a_cap_far_above_the_data_does_not_flatten_it() {
        // 1 GiB used under a 20 GiB cap: the band reaches near the top of the 232-px plot
        // (y = 14 at the top edge), and the cap is named above the chart.
        let svg = timeline(20 << 30);
        assert!(in_use_top(&svg) < 60.0, "{}", in_use_top(&svg));
        assert!(svg.contains("cap 20.0 GiB (above the chart)"), "{svg}");
        assert!(svg.contains("class=\"cap\""));
        // A cap near the data stays on the scale, drawn where it is.
        let svg = timeline(2 << 30);
        assert!(!svg.contains("above the chart"));
        assert!(in_use_top(&svg) > 100.0, "{}", in_use_top(&svg));
    }
}
