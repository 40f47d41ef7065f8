use std::os::unix::fs::PermissionsExt;

use super::*;

/// A fresh directory, removed (with what the test made in it) when dropped.
fn tmpdir(tag: &str) -> vramshim_testkit::TempDir {
    vramshim_testkit::TempDir::new(&format!("registry-{tag}"))
}

fn me() -> ProcessKey {
    ProcessKey::current().unwrap()
}

fn ident(cmd: &str, group: &str) -> Identity {
    Identity {
        uid: sys::euid(),
        start_ticks: 7,
        cmd: cmd.into(),
        group: group.into(),
        container: Container::default(),
    }
}

/// A real process (a `sleep`) and its key; killed by the caller.
fn sleeper() -> (std::process::Child, ProcessKey) {
    let child = std::process::Command::new("sleep")
        .arg("600")
        .spawn()
        .unwrap();
    let pid = child.id();
    let (start, _) = proc::stat(pid).unwrap();
    (child, ProcessKey::new(pid, start))
}

#[test]
fn register_publish_read_and_leave() {
    let r = Registry::anonymous().unwrap();
    let mut id = ident("python3", "job-a");
    id.container = parse_cgroup(
        "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod0f3c8a52_1b2d_4e5f_8a9b_0c1d2e3f4a5b.slice/cri-containerd-4c9d1e2f3a4b5c6d7e8f9a0b1c2d3e4f5a6b7c8d9e0f1a2b3c4d5e6f7a8b9c0d.scope\n",
    );
    let s = r.register(me(), &id).unwrap();
    let uuid = DeviceId([0xab; 16]);
    let rec = DeviceRecord {
        ordinal: 1,
        uuid: Some(uuid),
        cap: Some(1 << 30),
        group_cap: Some(4 << 30),
        used: 800 << 20,
        peak: 900 << 20,
        pool_reserved: 64 << 20,
    };
    r.publish_device(s, 0, &rec);
    r.publish_process(s, 3, 1, 0);
    r.set_flag(s, FLAG_WAITING, true);
    let snap = r.snapshot();
    assert_eq!(snap.len(), 1);
    let p = &snap[0];
    assert_eq!(p.pid, std::process::id());
    assert_eq!(p.identity, id);
    assert_eq!(p.devices, vec![rec]);
    assert_eq!(
        (p.refusals, p.ooms, p.flags),
        (3, 1, FLAG_WAITING | FLAG_GROUP_CAP)
    );
    assert!(p.group_cap_known());
    // An uncapped device with no UUID yet reads back as such (0 is not a cap of 0 bytes).
    let bare = DeviceRecord {
        ordinal: 0,
        ..DeviceRecord::default()
    };
    r.publish_device(s, 1, &bare);
    assert_eq!(r.snapshot()[0].devices[1], bare);
    // A second registration of the same process (after exec) reuses its slot.
    assert_eq!(r.register(me(), &ident("after-exec", "")), Some(s));
    assert_eq!(r.snapshot().len(), 1);
    assert_eq!(r.snapshot()[0].identity.cmd, "after-exec");
    assert!(
        r.snapshot()[0].devices.is_empty(),
        "a new image starts empty"
    );
    r.unregister(s, me());
    assert!(r.snapshot().is_empty());
}

/// A library from before the group cap word neither sets [`FLAG_GROUP_CAP`] nor writes the
/// word, which may still hold the slot's previous owner's group cap: that value is not read,
/// and the group cap reads as unknown, not as uncapped.
#[test]
fn an_older_writers_group_cap_is_unknown_not_a_stale_value() {
    let r = Registry::anonymous().unwrap();
    let s = r.register(me(), &ident("python3", "job")).unwrap();
    let rec = DeviceRecord {
        ordinal: 0,
        cap: Some(1 << 30),
        group_cap: Some(4 << 30),
        used: 1 << 20,
        ..DeviceRecord::default()
    };
    r.publish_device(s, 0, &rec);
    // A new writer's uncapped group reads as known and uncapped.
    r.publish_device(
        s,
        0,
        &DeviceRecord {
            group_cap: None,
            ..rec
        },
    );
    let p = &r.snapshot()[0];
    assert!(p.group_cap_known());
    assert_eq!(p.devices[0].group_cap, None);
    // The slot as an older library leaves it: its registration stored flags 0 over the
    // previous owner's, and the word keeps the previous owner's 4 GiB.
    r.publish_device(s, 0, &rec);
    r.set_flag(s, FLAG_GROUP_CAP, false);
    let p = &r.snapshot()[0];
    assert!(!p.group_cap_known());
    assert_eq!(
        p.devices[0].group_cap, None,
        "a previous owner's value read"
    );
    assert_eq!(p.devices[0].cap, Some(1 << 30));
    // A registration of this library clears the word and says it fills it.
    assert_eq!(r.register(me(), &ident("python3", "job")), Some(s));
    assert!(r.snapshot()[0].group_cap_known());
    r.unregister(s, me());
}

#[test]
fn long_or_odd_texts_are_cut_not_corrupted() {
    let r = Registry::anonymous().unwrap();
    let group = "é".repeat(40); // 80 bytes: cut at a character boundary within 64
    let s = r
        .register(me(), &ident("a-command-name-longer-than-16", &group))
        .unwrap();
    let p = &r.snapshot()[0];
    assert_eq!(p.identity.cmd, "a-command-name-l");
    assert_eq!(p.identity.group, "é".repeat(32));
    r.unregister(s, me());
}

#[test]
fn sigkilled_processes_vanish_and_their_slots_are_reused() {
    let r = Registry::anonymous().unwrap();
    let (mut child, key) = sleeper();
    let s = r.register(key, &ident("sleep", "")).unwrap();
    assert_eq!(r.snapshot().len(), 1);
    child.kill().unwrap(); // SIGKILL: no chance to unregister
    child.wait().unwrap();
    assert!(
        r.snapshot().is_empty(),
        "a killed process must not be shown"
    );
    // Fill every other slot with live entries (this process under other start times is not
    // live; use the liveness test to say they are), then register: the dead slot is reused.
    let always = |_k: ProcessKey| true;
    for i in 0..REG_SLOTS - 1 {
        let k = ProcessKey::new(u32::MAX - 10 - i as u32, 1);
        assert!(r.register_with(k, &ident("x", ""), &always).is_some());
    }
    let again = r
        .register_with(me(), &ident("me", ""), &|k| {
            k.alive(true) || k.pid() > 1 << 30
        })
        .expect("the killed process's slot must be reused");
    assert_eq!(again, s);
    // Full of live processes: refused, not overwritten.
    assert_eq!(
        r.register_with(ProcessKey::new(12345, 1), &ident("y", ""), &always),
        None
    );
}

#[test]
fn a_reused_pid_is_not_taken_for_the_registered_process() {
    let r = Registry::anonymous().unwrap();
    // This process's pid under another start time: a dead process whose pid was reused.
    let stale = ProcessKey::new(std::process::id(), me().start_low() + 1);
    r.register_with(stale, &ident("old", ""), &|_| true)
        .unwrap();
    assert!(
        r.snapshot().is_empty(),
        "a pid reused by another process must not keep the dead one's entry"
    );
    // With the start-time check broken (pid only), the dead entry shows as live: what the
    // check above guards against.
    assert_eq!(r.snapshot_with(&|k| k.alive(false)).len(), 1);
}

#[test]
fn concurrent_registrations_get_distinct_slots() {
    let r = std::sync::Arc::new(Registry::anonymous().unwrap());
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let r = r.clone();
            std::thread::spawn(move || {
                (0..100)
                    .map(|i| {
                        let k = ProcessKey::new(1_000_000 + t * 1000 + i, 1);
                        r.register_with(k, &ident("x", ""), &|_| true).unwrap().0
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let mut all: Vec<usize> = threads
        .into_iter()
        .flat_map(|t| t.join().unwrap())
        .collect();
    all.sort();
    all.dedup();
    assert_eq!(all.len(), 800, "two processes were given one slot");
    assert_eq!(r.snapshot_with(&|_| true).len(), 800);
}

#[test]
fn foreign_or_planted_files_are_refused() {
    let dir = tmpdir("refuse");
    let p = dir.join("reg");
    let r = Registry::open_or_create(&p).unwrap();
    let s = r.register(me(), &ident("t", "")).unwrap();
    // A second opener sees the first one's entry.
    assert_eq!(Registry::open(&p).unwrap().snapshot()[0].slot, s.0);
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
    let e = Registry::open_or_create(&p).err().unwrap();
    assert!(matches!(e.0, RegionError::Mode { .. }), "{e}");
    assert!(e.to_string().starts_with("node registry "), "{e}");
    // A symbolic link planted where the registry goes is never followed.
    let target = dir.join("target");
    std::fs::write(&target, b"x").unwrap();
    let link = dir.join("link");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    let e = Registry::open_or_create(&link).err().unwrap();
    assert!(matches!(e.0, RegionError::NotAFile { .. }), "{e}");
    assert_eq!(std::fs::read(&target).unwrap(), b"x");
    // Garbage of the right size, and a cap region in the registry's place.
    let g = dir.join("garbage");
    std::fs::write(&g, vec![0xabu8; reg_len()]).unwrap();
    std::fs::set_permissions(&g, std::fs::Permissions::from_mode(0o600)).unwrap();
    let e = Registry::open(&g).err().unwrap();
    assert!(e.to_string().contains("not a vramshim registry"), "{e}");
    let small = dir.join("small");
    std::fs::write(&small, vec![0u8; 100]).unwrap();
    std::fs::set_permissions(&small, std::fs::Permissions::from_mode(0o600)).unwrap();
    let e = Registry::open(&small).err().unwrap();
    assert!(e.to_string().contains("100 bytes"), "{e}");
    // Another user's file (root only: chown).
    if sys::euid() == 0 {
        let o = dir.join("other");
        Registry::open_or_create(&o).unwrap();
        std::os::unix::fs::chown(&o, Some(65534), None).unwrap();
        let e = Registry::open(&o).err().unwrap();
        assert!(
            matches!(e.0, RegionError::NotOwned { owner: 65534, .. }),
            "{e}"
        );
    }
}

#[test]
fn cgroup_forms() {
    let id64 = "4c9d1e2f3a4b5c6d7e8f9a0b1c2d3e4f5a6b7c8d9e0f1a2b3c4d5e6f7a8b9c0d";
    let pod = "0f3c8a52-1b2d-4e5f-8a9b-0c1d2e3f4a5b";
    let pod_ = pod.replace('-', "_");
    let cases: Vec<(String, Runtime, &str, &str)> = vec![
        (
            format!("0::/system.slice/docker-{id64}.scope"),
            Runtime::Docker,
            id64,
            "",
        ),
        (
            format!("12:memory:/docker/{id64}"),
            Runtime::Docker,
            id64,
            "",
        ),
        (
            format!("0::/system.slice/crio-{id64}.scope"),
            Runtime::Crio,
            id64,
            "",
        ),
        (
            format!("0::/user.slice/libpod-{id64}.scope/container"),
            Runtime::Podman,
            id64,
            "",
        ),
        (
            format!(
                "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{pod_}.slice/cri-containerd-{id64}.scope"
            ),
            Runtime::Containerd,
            id64,
            pod,
        ),
        (
            format!("0::/kubepods.slice/kubepods-pod{pod_}.slice/crio-{id64}.scope"),
            Runtime::Crio,
            id64,
            pod,
        ),
        (
            format!("4:cpu:/kubepods/burstable/pod{pod}/{id64}"),
            Runtime::Kubepods,
            id64,
            pod,
        ),
        (
            "0::/user.slice/user-1000.slice/session-2.scope".into(),
            Runtime::None,
            "",
            "",
        ),
        ("garbage without colons".into(), Runtime::None, "", ""),
        (
            format!("0::/system.slice/docker-{}.scope", "zz".repeat(32)),
            Runtime::None,
            "",
            "",
        ),
    ];
    for (text, rt, id, pod_uid) in cases {
        let c = parse_cgroup(&text);
        assert_eq!(
            c,
            Container {
                runtime: rt,
                id: id.into(),
                pod_uid: pod_uid.into()
            },
            "{text}"
        );
    }
}
