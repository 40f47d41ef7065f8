//! Fills a node registry for the exporter's scrape benchmark (`scripts/bench registry`):
//! `registry_fill PATH` registers every pid read from stdin (one a line; live processes, so
//! that readers keep them) with one device each, as libvramshim.so would, and exits.

use std::io::BufRead;

use vramshim_region::registry::{Container, DeviceRecord, Identity, Registry};
use vramshim_region::{DeviceId, ProcessKey};

fn main() {
    let Some(path) = std::env::args().nth(1) else {
        eprintln!("usage: registry_fill PATH < pids");
        std::process::exit(2);
    };
    let reg = match Registry::open_or_create(std::path::Path::new(&path)) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("registry_fill: {e}");
            std::process::exit(1);
        }
    };
    let uid = std::fs::metadata("/proc/self").map_or(0, |m| {
        use std::os::unix::fs::MetadataExt;
        m.uid()
    });
    let mut n = 0u64;
    for line in std::io::stdin().lock().lines().map_while(Result::ok) {
        let Ok(pid) = line.trim().parse::<u32>() else {
            continue;
        };
        let Some((start, _)) = vramshim_region::proc::stat(pid) else {
            continue;
        };
        let id = Identity {
            uid,
            start_ticks: start,
            cmd: format!("bench-{}", n % 7),
            group: format!("group-{}", n % 10),
            container: Container::default(),
        };
        let Some(s) = reg.register(ProcessKey::new(pid, start), &id) else {
            eprintln!("registry_fill: the registry is full after {n} processes");
            break;
        };
        let gpu = n % 8;
        let mut uuid = [0u8; 16];
        uuid[0] = gpu as u8;
        reg.publish_device(
            s,
            0,
            &DeviceRecord {
                ordinal: 0,
                uuid: Some(DeviceId(uuid)),
                cap: Some(8 << 30),
                group_cap: None,
                used: (n + 1) << 20,
                peak: (n + 2) << 20,
                pool_reserved: 0,
            },
        );
        reg.publish_process(s, n % 3, 0, 0);
        n += 1;
    }
    println!("{n}");
}
