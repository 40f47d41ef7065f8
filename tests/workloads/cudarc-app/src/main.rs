//! cudarc-app: a Rust program using cudarc's safe API on whatever `libcuda.so` the loader finds
//! (cudarc `dlopen`s it; run with `LD_LIBRARY_PATH=<sim_dir>` or `scripts/sim-run`).
//!
//! `cudarc-app [ELEMENTS]`: creates a context on device 0, `alloc_zeros`, a host-to-device and
//! device-to-host round trip (`clone_htod` / `clone_dtoh`, the current names of
//! `memcpy_stod` / `memcpy_dtov`) on the default and on a new stream, and prints
//! `cudarc-app: ok elements=N free=BYTES total=BYTES`. Exits 1 with the error otherwise.

use cudarc::driver::CudaContext;

fn run(n: usize) -> Result<String, Box<dyn std::error::Error>> {
    let ctx = CudaContext::new(0)?;
    let stream = ctx.default_stream();

    let zeros = stream.alloc_zeros::<u32>(n)?;
    let back = stream.clone_dtoh(&zeros)?;
    if back.len() != n || back.iter().any(|&v| v != 0) {
        return Err("alloc_zeros did not read back as zeros".into());
    }

    let host: Vec<u32> = (0..n as u32)
        .map(|i| i.wrapping_mul(2_654_435_761))
        .collect();
    let dev = stream.clone_htod(&host)?;
    let back = stream.clone_dtoh(&dev)?;
    if back != host {
        return Err("host -> device -> host round trip changed the data".into());
    }

    let side = ctx.new_stream()?;
    let dev2 = side.clone_htod(&host)?;
    let back2 = side.clone_dtoh(&dev2)?;
    side.synchronize()?;
    if back2 != host {
        return Err("round trip on a second stream changed the data".into());
    }

    let (free, total) = ctx.mem_get_info()?;
    drop((zeros, dev, dev2));
    Ok(format!(
        "cudarc-app: ok elements={n} free={free} total={total}"
    ))
}

fn main() {
    let n = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(1 << 20);
    match run(n) {
        Ok(line) => println!("{line}"),
        Err(e) => {
            eprintln!("cudarc-app: {e}");
            std::process::exit(1);
        }
    }
}
