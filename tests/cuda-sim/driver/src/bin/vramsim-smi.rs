//! `vramsim-smi [NAME]`: prints the simulated device's own accounting as one JSON object
//! (capacity, bytes used and high-water mark per device, refusals, processes). NAME defaults
//! to $VRAMSIM_NAME, then "default". Exit status 1 if the device was never created.

fn main() {
    let name = std::env::args()
        .nth(1)
        .or_else(|| std::env::var("VRAMSIM_NAME").ok().filter(|s| !s.is_empty()))
        .unwrap_or_else(|| vramsim_devstate::DEFAULT_NAME.to_string());
    match vramsim_devstate::DeviceState::open(&name) {
        Ok(d) => println!("{}", d.to_json()),
        Err(e) => {
            eprintln!(
                "vramsim-smi: no simulated device {name:?} ({}): {e}",
                vramsim_devstate::DeviceState::path(&name).display()
            );
            std::process::exit(1);
        }
    }
}
