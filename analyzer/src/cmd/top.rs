//! `vramshim top`: a live view of the shared cap regions (`VRAMSHIM_SHARED=NAME`): the
//! processes sharing each, their use per device, the cap, the peak and refusals so far, who
//! waits for room (`VRAMSHIM_ON_CAP=wait`); and
//! of the node registry: every process under libvramshim.so, by GPU and by group.
//! Refreshes on a terminal; `--once` (or output to a pipe) prints one snapshot; `--json` prints
//! one machine-readable snapshot. Looking also reclaims the slots of dead processes (as any
//! process of the group would), unless `--no-reclaim`.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use serde_json::{Value, json};
use vramshim_analyzer::render::one_line;
use vramshim_region::spec::{self, CapValue, human_bytes};
use vramshim_region::{MAX_DEVICES, ProcessKey, Region, Snapshot};

#[derive(clap::Args)]
pub struct Args {
    /// The region: a VRAMSHIM_SHARED name or an absolute path (default: every region of this
    /// user in /dev/shm).
    #[arg(long)]
    pub name: Option<String>,
    /// Print one snapshot and exit (for scripts).
    #[arg(long)]
    pub once: bool,
    /// Print one snapshot as JSON and exit.
    #[arg(long)]
    pub json: bool,
    /// Seconds between refreshes on a terminal.
    #[arg(long, default_value_t = 1.0, value_parser = crate::cmd::numbers::seconds)]
    pub interval: f64,
    /// Only look: do not give dead processes' shares back.
    #[arg(long)]
    pub no_reclaim: bool,
    /// The node registry to show (default: VRAMSHIM_REGISTRY, else
    /// /dev/shm/vramshim-registry-<uid>).
    #[arg(long, value_name = "PATH")]
    pub registry: Option<PathBuf>,
}

fn uid() -> u32 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self")
        .map(|m| m.uid())
        .unwrap_or(0)
}

/// The region files to show: the named one, or all of this user's in /dev/shm.
fn region_paths(name: Option<&str>) -> Result<Vec<(String, PathBuf)>, String> {
    let uid = uid();
    if let Some(n) = name {
        let p = spec::shared_path(n, uid)
            .map_err(|e| format!("--name {n:?} is not valid ({e}); {}", spec::SHARED_FORMS))?;
        return Ok(vec![(n.to_string(), p)]);
    }
    let prefix = format!("vramshim-{uid}-");
    let mut out = Vec::new();
    if let Ok(rd) = std::fs::read_dir("/dev/shm") {
        for e in rd.flatten() {
            let f = e.file_name().to_string_lossy().into_owned();
            if let Some(n) = f.strip_prefix(&prefix) {
                out.push((n.to_string(), e.path()));
            }
        }
    }
    out.sort();
    Ok(out)
}

struct View {
    name: String,
    path: PathBuf,
    snap: Result<Snapshot, String>,
}

fn look(name: &str, path: &Path, reclaim: bool) -> View {
    let snap = Region::open(path).map_err(|e| e.to_string()).map(|r| {
        if reclaim && let Some(me) = ProcessKey::current() {
            r.reclaim(me);
        }
        r.snapshot()
    });
    View {
        name: name.to_string(),
        path: path.to_path_buf(),
        snap,
    }
}

/// Devices worth a row: capped ones and ones with any activity.
fn devices(s: &Snapshot) -> Vec<usize> {
    let active = |d: usize| s.totals[d] > 0 || s.peaks[d] > 0 || s.refusals[d] > 0;
    let v: Vec<usize> = (0..MAX_DEVICES)
        .filter(|&d| active(d) || (!s.caps.all && s.caps.devices[d].is_some()))
        .collect();
    if v.is_empty() { vec![0] } else { v }
}

/// A line's device: `GPU-xxxxxxxx` (its UUID, as nvidia-smi shows it), or the line number
/// while no process has charged it.
fn device_label(s: &Snapshot, line: usize) -> String {
    s.identities[line].map_or_else(|| format!("line {line}"), |id| id.short())
}

/// The cap on a line. Lines are physical devices; a per-device cap list names each process's
/// own CUDA ordinals, which need not match between processes, so only a cap for every
/// device has one value per line.
fn line_cap_text(s: &Snapshot, line: usize) -> String {
    if s.caps.all {
        cap_text(s.caps.devices[line])
    } else {
        "per ordinal".into()
    }
}

fn cap_text(c: Option<CapValue>) -> String {
    match c {
        None => "none".into(),
        Some(CapValue::Bytes(b)) => human_bytes(b),
        Some(CapValue::Fraction(f)) => format!("{}% of device", (f * 10000.0).round() / 100.0),
    }
}

/// The region's caps in words: `4 GiB per device`, `0=4 GiB, 1=50% of device`, `none`.
fn caps_text(s: &Snapshot) -> String {
    if s.caps.all {
        return format!("{} per device", cap_text(s.caps.devices[0]));
    }
    let v: Vec<String> = (0..MAX_DEVICES)
        .filter_map(|d| s.caps.devices[d].map(|c| format!("{d}={}", cap_text(Some(c)))))
        .collect();
    if v.is_empty() {
        "none".into()
    } else {
        v.join(", ")
    }
}

fn render_text(views: &[View]) -> String {
    let mut o = String::new();
    if views.is_empty() {
        o.push_str(&format!(
            "no shared cap regions of uid {} in /dev/shm\n",
            uid()
        ));
    }
    for v in views {
        let s = match &v.snap {
            Ok(s) => s,
            Err(e) => {
                o.push_str(&format!(
                    "region {} ({}): {}\n\n",
                    one_line(&v.name),
                    one_line(&v.path.to_string_lossy()),
                    one_line(e)
                ));
                continue;
            }
        };
        let live = s.processes.iter().filter(|p| p.alive).count();
        o.push_str(&format!(
            "region {} ({})  cap {}  {} process{}\n",
            one_line(&v.name),
            one_line(&v.path.to_string_lossy()),
            caps_text(s),
            live,
            if live == 1 { "" } else { "es" }
        ));
        let devs = devices(s);
        o.push_str(&format!(
            "  {:<12} {:>16} {:>12} {:>12} {:>9} {:>8}\n",
            "DEVICE", "CAP", "IN USE", "PEAK", "REFUSED", "WAITING"
        ));
        for &d in &devs {
            o.push_str(&format!(
                "  {:<12} {:>16} {:>12} {:>12} {:>9} {:>8}\n",
                device_label(s, d),
                line_cap_text(s, d),
                human_bytes(s.totals[d]),
                human_bytes(s.peaks[d]),
                s.refusals[d],
                waiting_on(s, d)
            ));
        }
        if !s.processes.is_empty() {
            o.push_str(&format!("  {:<8} {:<16}", "PID", "COMMAND"));
            for &d in &devs {
                o.push_str(&format!(" {:>12}", device_label(s, d)));
            }
            o.push_str(&format!(" {:>9} {:>8}\n", "REFUSED", "WAITING"));
            for p in &s.processes {
                let comm = if p.alive {
                    vramshim_region::proc::comm(p.pid).unwrap_or_default()
                } else {
                    "(dead)".into()
                };
                o.push_str(&format!("  {:<8} {:<16}", p.pid, one_line(&comm)));
                for &d in &devs {
                    o.push_str(&format!(" {:>12}", human_bytes(p.used[d])));
                }
                let waiting = if p.alive && p.waiting != 0 {
                    "yes"
                } else {
                    "-"
                };
                o.push_str(&format!(" {:>9} {:>8}\n", p.refusals, waiting));
            }
        }
        o.push('\n');
    }
    o
}

/// Live members with a request waiting for room on line `d` (`VRAMSHIM_ON_CAP=wait`).
fn waiting_on(s: &Snapshot, d: usize) -> usize {
    s.processes
        .iter()
        .filter(|p| p.alive && p.waiting & (1 << d) != 0)
        .count()
}

fn cap_json(c: Option<CapValue>) -> Value {
    match c {
        None => Value::Null,
        Some(CapValue::Bytes(b)) => json!({ "bytes": b }),
        Some(CapValue::Fraction(f)) => json!({ "fraction": f }),
    }
}

fn render_json(views: &[View]) -> Value {
    let regions: Vec<Value> = views
        .iter()
        .map(|v| match &v.snap {
            Err(e) => json!({ "name": v.name, "path": v.path, "error": e }),
            Ok(s) => json!({
                "name": v.name,
                "path": v.path,
                "cap": s.cap_text,
                "created_unix": s.created_unix,
                "devices": (0..MAX_DEVICES).filter(|&d| devices(s).contains(&d)).map(|d| json!({
                    "device": d,
                    "id": s.identities[d].map(|id| id.short()),
                    "cap": if s.caps.all { cap_json(s.caps.devices[d]) } else { Value::Null },
                    "in_use": s.totals[d],
                    "peak": s.peaks[d],
                    "refusals": s.refusals[d],
                    "waiting": waiting_on(s, d),
                })).collect::<Vec<_>>(),
                "in_use": s.totals.to_vec(),
                "processes": s.processes.iter().map(|p| json!({
                    "pid": p.pid,
                    "command": vramshim_region::proc::comm(p.pid).filter(|_| p.alive),
                    "alive": p.alive,
                    "start_ticks": p.start_ticks,
                    "used": p.used.to_vec(),
                    "refusals": p.refusals,
                    "waiting": p.alive && p.waiting != 0,
                })).collect::<Vec<_>>(),
            }),
        })
        .collect();
    json!({ "regions": regions })
}

pub fn main(args: Args) -> Result<ExitCode, String> {
    let paths = region_paths(args.name.as_deref())?;
    let reg_path = super::node::registry_path(args.registry.as_deref())?;
    let node_text = || super::node::render_text(&reg_path, &super::node::read(&reg_path));
    let snapshot = || -> Vec<View> {
        paths
            .iter()
            .map(|(n, p)| look(n, p, !args.no_reclaim))
            .collect()
    };
    let failed = |views: &[View]| args.name.is_some() && views.iter().any(|v| v.snap.is_err());
    if args.json {
        let views = snapshot();
        let mut j = render_json(&views);
        j["node"] = super::node::render_json(&reg_path, &super::node::read(&reg_path));
        println!("{}", vramshim_analyzer::json::to_string_pretty(&j)?);
        return Ok(if failed(&views) {
            ExitCode::from(1)
        } else {
            ExitCode::SUCCESS
        });
    }
    let live = !args.once && std::io::stdout().is_terminal();
    if !live {
        let views = snapshot();
        print!("{}{}", render_text(&views), node_text());
        return Ok(if failed(&views) {
            ExitCode::from(1)
        } else {
            ExitCode::SUCCESS
        });
    }
    let interval = Duration::from_secs_f64(args.interval.clamp(0.05, 3600.0));
    loop {
        let paths_now = if args.name.is_some() {
            paths.clone()
        } else {
            region_paths(None)?
        };
        let views: Vec<View> = paths_now
            .iter()
            .map(|(n, p)| look(n, p, !args.no_reclaim))
            .collect();
        let mut out = std::io::stdout().lock();
        let _ = writeln!(
            out,
            "\x1b[H\x1b[2J{}{}(refreshing every {:?}; Ctrl-C to quit)",
            render_text(&views),
            node_text(),
            interval
        );
        let _ = out.flush();
        drop(out);
        std::thread::sleep(interval);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vramshim_region::{Check, spec::parse_cap};

    #[test]
    fn renders_a_region() {
        let dir = vramshim_testkit::TempDir::new("top");
        let path = dir.join("r");
        let (r, _) = Region::open_or_create(&path, &parse_cap("0=4GiB,1=0.5").unwrap()).unwrap();
        let me = ProcessKey::current().unwrap();
        let s = r.claim_slot(me, 0).unwrap();
        let gpu = vramshim_region::DeviceId([0xab; 16]);
        assert_eq!(r.line_for(gpu), Some(0));
        r.charge(s, 0, 3 << 30, 4 << 30, Check::Atomic).unwrap();
        r.note_refusal(s, 0);
        r.begin_wait(s, 0);
        let dead = r.claim_slot(ProcessKey::new(u32::MAX - 9, 1), 0).unwrap();
        r.charge(dead, 1, 1 << 20, u64::MAX, Check::Atomic).unwrap();
        let v = look("job", &path, true);
        let text = render_text(std::slice::from_ref(&v));
        assert!(text.contains("region job"), "{text}");
        assert!(text.contains("cap 0=4 GiB, 1=50% of device"), "{text}");
        assert!(
            text.contains("3 GiB") && text.contains("4 GiB") && text.contains("50% of device"),
            "{text}"
        );
        assert!(text.contains(&me.pid().to_string()), "{text}");
        assert!(
            text.contains("GPU-abababab"),
            "lines show their device: {text}"
        );
        let j = render_json(&[v]);
        let reg = &j["regions"][0];
        assert_eq!(reg["in_use"][0], 3u64 << 30);
        assert_eq!(
            reg["in_use"][1], 0,
            "the dead process's share was reclaimed by looking"
        );
        assert_eq!(reg["processes"].as_array().unwrap().len(), 1);
        assert_eq!(reg["devices"][0]["refusals"], 1);
        assert_eq!(reg["devices"][0]["waiting"], 1);
        assert_eq!(reg["processes"][0]["waiting"], true);
        assert_eq!(reg["devices"][0]["id"], "GPU-abababab");
        assert_eq!(
            reg["devices"][0]["cap"],
            Value::Null,
            "a per-ordinal cap has no single value per physical device"
        );
        let (all, _) =
            Region::open_or_create(&dir.join("all"), &parse_cap("50%").unwrap()).unwrap();
        let s = all.claim_slot(me, 0).unwrap();
        all.charge(s, 0, 1 << 20, u64::MAX, Check::Atomic).unwrap();
        let j = render_json(&[look("all", &dir.join("all"), true)]);
        assert_eq!(j["regions"][0]["devices"][0]["cap"]["fraction"], 0.5);
        let v = look("missing", &dir.join("none"), true);
        assert!(render_text(&[v]).contains("does not exist"));
    }

    /// A region's name is the rest of a file name in /dev/shm, where any local user may create
    /// files of any name, this user's prefix included: shown on one line, its control
    /// characters escaped, whether the region opens or not (no escape sequence reaches the
    /// terminal, no line is forged).
    #[test]
    fn a_regions_name_reaches_the_terminal_escaped() {
        let dir = vramshim_testkit::TempDir::new("top-names");
        let name = "x\x1b]0;owned\x07\nregion forged";
        let path = dir.join(name);
        let missing = render_text(&[look(name, &path, false)]);
        Region::open_or_create(&path, &parse_cap("4GiB").unwrap()).unwrap();
        let opened = render_text(&[look(name, &path, false)]);
        for text in [missing, opened] {
            assert!(!text.contains('\x1b') && !text.contains('\x07'), "{text:?}");
            assert!(
                text.contains("region x\\u{1b}]0;owned\\u{7}\\nregion forged ("),
                "{text:?}"
            );
            assert_eq!(
                text.lines().filter(|l| l.starts_with("region ")).count(),
                1,
                "{text:?}"
            );
        }
    }
}
