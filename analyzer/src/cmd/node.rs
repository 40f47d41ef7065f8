//! The node registry as `vramshim top` and `vramshim exporter` read it: where it is, one read
//! of it, and its text and JSON renderings (every registered process, grouped by GPU and by
//! shared group).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::{Value, json};
use vramshim_analyzer::render::one_line;
use vramshim_region::registry::{self, FLAG_WAITING, Registered, Registry};
use vramshim_region::spec::human_bytes;

/// The registry to read: `--registry PATH`, else `VRAMSHIM_REGISTRY` (an absolute path), else
/// `/dev/shm/vramshim-registry-<uid>`.
pub(crate) fn registry_path(arg: Option<&Path>) -> Result<PathBuf, String> {
    if let Some(p) = arg {
        return Ok(p.to_path_buf());
    }
    match std::env::var("VRAMSHIM_REGISTRY")
        .ok()
        .as_deref()
        .map(str::trim)
    {
        None | Some("") | Some("off") | Some("0") => Ok(registry::default_path(uid())),
        Some(p) if p.starts_with('/') => Ok(PathBuf::from(p)),
        Some(p) => Err(format!(
            "VRAMSHIM_REGISTRY={p:?} is not valid; accepted: off, or an absolute path"
        )),
    }
}

fn uid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// The live registered processes (an absent registry is an empty node).
pub(crate) fn read(path: &Path) -> Result<Vec<Registered>, String> {
    match Registry::open(path) {
        Ok(r) => Ok(r.snapshot()),
        Err(registry::RegistryError(vramshim_region::RegionError::NotFound { .. })) => {
            Ok(Vec::new())
        }
        Err(e) => Err(e.to_string()),
    }
}

/// A device's name across processes: its UUID (`GPU-xxxxxxxx…` in full), else the ordinal
/// the process sees it as.
pub(crate) fn gpu_name(d: &registry::DeviceRecord) -> String {
    match d.uuid {
        Some(u) if !u.0.starts_with(b"ORDINAL:") => uuid_text(&u.0),
        _ => format!("ordinal {}", d.ordinal),
    }
}

/// The UUID as nvidia-smi prints it: `GPU-8-4-4-4-12` hex digits.
pub(crate) fn uuid_text(b: &[u8; 16]) -> String {
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "GPU-{}-{}-{}-{}-{}",
        &h[..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..]
    )
}

fn short_id(id: &str) -> &str {
    id.get(..12).unwrap_or(id)
}

fn opt_bytes(c: Option<u64>) -> String {
    c.map_or_else(|| "none".into(), human_bytes)
}

/// The registry section of `vramshim top`.
pub(crate) fn render_text(path: &Path, procs: &Result<Vec<Registered>, String>) -> String {
    let procs = match procs {
        Ok(p) => p,
        // The reason names the registry already ("node registry PATH ...").
        Err(e) => return format!("{e}\n"),
    };
    let mut o = format!(
        "node registry {}  {} process{}\n",
        path.display(),
        procs.len(),
        if procs.len() == 1 { "" } else { "es" }
    );
    // By GPU: every process's line on it.
    let mut by_gpu: BTreeMap<String, Vec<(&Registered, &registry::DeviceRecord)>> = BTreeMap::new();
    for p in procs {
        for d in &p.devices {
            by_gpu.entry(gpu_name(d)).or_default().push((p, d));
        }
    }
    for (gpu, rows) in &by_gpu {
        let used: u64 = rows.iter().map(|(_, d)| d.used).sum();
        let pool: u64 = rows.iter().map(|(_, d)| d.pool_reserved).sum();
        o.push_str(&format!(
            "  {gpu}  in use {}  pool reserved {}  {} process{}\n",
            human_bytes(used),
            human_bytes(pool),
            rows.len(),
            if rows.len() == 1 { "" } else { "es" }
        ));
        o.push_str(&format!(
            "    {:<8} {:<16} {:<16} {:<12} {:>12} {:>12} {:>12} {:>12} {:>8} {:>5} {}\n",
            "PID",
            "COMMAND",
            "GROUP",
            "CONTAINER",
            "IN USE",
            "PEAK",
            "CAP",
            "POOL",
            "REFUSED",
            "OOM",
            "STATE"
        ));
        for (p, d) in rows {
            let group = if p.identity.group.is_empty() {
                "-"
            } else {
                &p.identity.group
            };
            let container = if p.identity.container.id.is_empty() {
                "-"
            } else {
                short_id(&p.identity.container.id)
            };
            o.push_str(&format!(
                "    {:<8} {:<16} {:<16} {:<12} {:>12} {:>12} {:>12} {:>12} {:>8} {:>5} {}\n",
                p.pid,
                one_line(&p.identity.cmd),
                one_line(group),
                one_line(container),
                human_bytes(d.used),
                human_bytes(d.peak),
                opt_bytes(d.cap),
                human_bytes(d.pool_reserved),
                p.refusals,
                p.ooms,
                if p.flags & FLAG_WAITING != 0 {
                    "waiting on cap"
                } else {
                    "running"
                }
            ));
        }
    }
    let idle: Vec<String> = procs
        .iter()
        .filter(|p| p.devices.is_empty())
        .map(|p| format!("{} ({})", p.pid, one_line(&p.identity.cmd)))
        .collect();
    if !idle.is_empty() {
        o.push_str(&format!("  no device memory yet: {}\n", idle.join(", ")));
    }
    // By group: members and use per GPU.
    let mut by_group: BTreeMap<&str, Vec<&Registered>> = BTreeMap::new();
    for p in procs.iter().filter(|p| !p.identity.group.is_empty()) {
        by_group.entry(&p.identity.group).or_default().push(p);
    }
    for (g, members) in &by_group {
        // Per GPU: the members' use, and the group's cap as the members whose library
        // publishes it say (None: none of them does; Some(None): uncapped). A member's own
        // stricter cap is on its row: it is never the group's.
        let mut per: BTreeMap<String, (u64, Option<Option<u64>>)> = BTreeMap::new();
        for p in members {
            for d in &p.devices {
                let e = per.entry(gpu_name(d)).or_insert((0, None));
                e.0 += d.used;
                if p.group_cap_known() {
                    e.1 = Some(e.1.flatten().max(d.group_cap));
                }
            }
        }
        let gpus: Vec<String> = per
            .iter()
            .map(|(gpu, (u, c))| {
                let cap = c.map_or_else(
                    || "an unknown cap (its members' libvramshim.so predates the group cap)".into(),
                    opt_bytes,
                );
                format!("{gpu} {} of {cap}", human_bytes(*u))
            })
            .collect();
        let pids: Vec<String> = members.iter().map(|p| p.pid.to_string()).collect();
        o.push_str(&format!(
            "  group {}: pids {}; {}\n",
            one_line(g),
            pids.join(" "),
            if gpus.is_empty() {
                "no device memory yet".to_string()
            } else {
                gpus.join(", ")
            }
        ));
    }
    o
}

/// The registry part of `vramshim top --json`.
pub(crate) fn render_json(path: &Path, procs: &Result<Vec<Registered>, String>) -> Value {
    match procs {
        Err(e) => json!({ "path": path, "error": e }),
        Ok(procs) => json!({
            "path": path,
            "processes": procs.iter().map(|p| json!({
                "pid": p.pid,
                "uid": p.identity.uid,
                "command": p.identity.cmd,
                "group": p.identity.group,
                "runtime": p.identity.container.runtime.name(),
                "container": p.identity.container.id,
                "pod_uid": p.identity.container.pod_uid,
                "waiting": p.flags & FLAG_WAITING != 0,
                "group_cap_known": p.group_cap_known(),
                "refusals": p.refusals,
                "ooms": p.ooms,
                "devices": p.devices.iter().map(|d| json!({
                    "ordinal": d.ordinal,
                    "gpu": gpu_name(d),
                    "cap": d.cap,
                    "group_cap": d.group_cap,
                    "used": d.used,
                    "peak": d.peak,
                    "pool_reserved": d.pool_reserved,
                })).collect::<Vec<_>>(),
            })).collect::<Vec<_>>(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vramshim_region::DeviceId;
    use vramshim_region::ProcessKey;
    use vramshim_region::registry::{DeviceRecord, Identity};

    /// A fresh registry in a directory of its own (`tag`), with this process registered in it
    /// as `trainer` of group `job`: (directory, registry path, registry, key, slot).
    fn trainer_in_job(
        tag: &str,
        container: registry::Container,
    ) -> (
        vramshim_testkit::TempDir,
        PathBuf,
        Registry,
        ProcessKey,
        registry::RegSlotIndex,
    ) {
        let dir = vramshim_testkit::TempDir::new(&format!("node-{tag}"));
        let path = dir.join("reg");
        let r = Registry::open_or_create(&path).unwrap();
        let me = ProcessKey::current().unwrap();
        let id = Identity {
            uid: uid(),
            start_ticks: 1,
            cmd: "trainer".into(),
            group: "job".into(),
            container,
        };
        let s = r.register(me, &id).unwrap();
        (dir, path, r, me, s)
    }

    /// 800 MiB in use under its own 1 GiB cap, in a group of cap `group_cap`.
    fn own_cap_1gib(group_cap: Option<u64>) -> DeviceRecord {
        DeviceRecord {
            ordinal: 0,
            uuid: Some(DeviceId([0x11; 16])),
            cap: Some(1 << 30),
            group_cap,
            used: 800 << 20,
            peak: 900 << 20,
            pool_reserved: 0,
        }
    }

    #[test]
    fn renders_the_node_by_gpu_and_by_group() {
        let docker = registry::parse_cgroup(&format!(
            "0::/system.slice/docker-{}.scope",
            "ab".repeat(32)
        ));
        let (dir, path, r, me, s) = trainer_in_job("render", docker);
        // Its own 1 GiB binds inside the group's 4 GiB.
        r.publish_device(s, 0, &own_cap_1gib(Some(4 << 30)));
        r.set_flag(s, FLAG_WAITING, true);
        let procs = read(&path);
        let text = render_text(&path, &procs);
        assert!(
            text.contains("GPU-11111111-1111-1111-1111-111111111111  in use 800 MiB"),
            "{text}"
        );
        assert!(
            text.contains("trainer") && text.contains("abababababab"),
            "{text}"
        );
        assert!(text.contains("waiting on cap"), "{text}");
        assert!(
            text.contains(&format!("group job: pids {}; GPU-11111111", me.pid())),
            "{text}"
        );
        assert!(text.contains("800 MiB of 4 GiB"), "{text}");
        assert!(
            text.contains("1 GiB"),
            "the member's own cap on its row: {text}"
        );
        let j = render_json(&path, &procs);
        assert_eq!(j["processes"][0]["devices"][0]["used"], 800u64 << 20);
        assert_eq!(j["processes"][0]["devices"][0]["cap"], 1u64 << 30);
        assert_eq!(j["processes"][0]["devices"][0]["group_cap"], 4u64 << 30);
        assert_eq!(j["processes"][0]["runtime"], "docker");
        r.unregister(s, me);
        assert!(read(&path).unwrap().is_empty());
        assert!(read(&dir.join("absent")).unwrap().is_empty());
        std::fs::write(dir.join("bad"), b"x").unwrap();
        let bad = read(&dir.join("bad"));
        let e = bad.clone().unwrap_err();
        assert!(e.starts_with("node registry "), "{e}");
        let text = render_text(&dir.join("bad"), &bad);
        assert_eq!(
            text,
            format!("{e}\n"),
            "said once, naming the registry once"
        );
    }

    /// A process's own words (its command name, which it may set to anything, and its group)
    /// reach the terminal escaped as every other string from elsewhere
    /// (`vramshim_analyzer::terminal`): no escape sequence is passed through, no line is
    /// broken, no line is shown reversed.
    #[test]
    fn names_reach_the_terminal_without_control_characters() {
        let (_dir, path, r, me, s) = trainer_in_job("names", Default::default());
        let id = Identity {
            uid: uid(),
            start_ticks: 1,
            cmd: "a\x1b]0;t\x07\n".into(),
            group: "g\x1b[2J\u{202e}x".into(),
            container: Default::default(),
        };
        assert_eq!(r.register(me, &id), Some(s));
        r.publish_device(s, 0, &own_cap_1gib(None));
        let text = render_text(&path, &read(&path));
        assert!(!text.contains('\x1b') && !text.contains('\x07'), "{text:?}");
        assert!(text.contains("a\\u{1b}]0;t\\u{7}\\n"), "{text:?}");
        assert!(
            text.contains("group g\\u{1b}[2J\\u{202e}x: pids"),
            "{text:?}"
        );
        assert!(!text.contains('\u{202e}'), "{text:?}");
        // Rows and group lines only: a broken line would add one.
        assert_eq!(text.lines().count(), 5, "{text:?}");
        r.unregister(s, me);
    }

    /// A member with its own 1 GiB cap in a group that leaves the GPU uncapped: the group's
    /// line says the group is uncapped (the 1 GiB is the member's, on its row). A member whose
    /// library predates the group cap says nothing of it: the group's cap reads as unknown,
    /// not as its own cap nor as uncapped.
    #[test]
    fn a_members_own_cap_is_not_its_groups() {
        let (_dir, path, r, me, s) = trainer_in_job("group-cap", Default::default());
        r.publish_device(s, 0, &own_cap_1gib(None));
        let text = render_text(&path, &read(&path));
        assert!(text.contains("800 MiB of none"), "{text}");
        assert!(!text.contains("of 1 GiB"), "{text}");
        let j = render_json(&path, &read(&path));
        assert_eq!(j["processes"][0]["group_cap_known"], true);
        assert_eq!(j["processes"][0]["devices"][0]["group_cap"], Value::Null);
        // The same record as an older library writes it.
        r.set_flag(s, registry::FLAG_GROUP_CAP, false);
        let text = render_text(&path, &read(&path));
        assert!(text.contains("800 MiB of an unknown cap"), "{text}");
        assert!(!text.contains("of 1 GiB"), "{text}");
        let j = render_json(&path, &read(&path));
        assert_eq!(j["processes"][0]["group_cap_known"], false);
        r.unregister(s, me);
    }
}
