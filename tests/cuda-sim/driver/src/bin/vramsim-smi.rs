//! `vramsim-smi [NAME]`: prints the simulated device's own accounting as one JSON object
//! (capacity, bytes used and high-water mark per device, refusals, processes). NAME defaults
//! to $VRAMSIM_NAME, then "default". Exit status 1 if the device was never created.
//! `vramsim-smi --remove NAME`: deletes the device's region (a later process starts afresh).

fn main() {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let remove = args.first().is_some_and(|a| a == "--remove");
    if remove {
        args.remove(0);
    }
    let name = args
        .first()
        .cloned()
        .or_else(|| std::env::var("VRAMSIM_NAME").ok().filter(|s| !s.is_empty()))
        .unwrap_or_else(|| vramsim_devstate::DEFAULT_NAME.to_string());
    let path = vramsim_devstate::DeviceState::path(&name);
    if remove {
        if let Err(e) = std::fs::remove_file(&path) {
            eprintln!("vramsim-smi: cannot remove {}: {e}", path.display());
            std::process::exit(1);
        }
        return;
    }
    match vramsim_devstate::DeviceState::open(&name) {
        Ok(d) => println!("{}", d.to_json()),
        Err(e) => {
            eprintln!(
                "vramsim-smi: no simulated device {name:?} ({}): {e}",
                path.display()
            );
            std::process::exit(1);
        }
    }
}
