use vramshim_pool::replay::Event;
use vramshim_pool::stitch::Stitch;
use vramshim_pool::{AccountingDevice, MIB, Policy, Request, rmm_csv};
fn main() {
    let a: Vec<String> = std::env::args().collect();
    let t = rmm_csv::parse_file(&a[1]).unwrap();
    let cap: u64 = a[2].parse::<u64>().unwrap() * MIB;
    let mut dev = AccountingDevice::new(cap);
    let mut p = Stitch::new();
    let mut ids = std::collections::HashMap::new();
    for (i, e) in t.events.iter().enumerate() {
        match *e {
            Event::Alloc { id, size, stream } => {
                match p.alloc(&mut dev, Request { size, stream }) {
                    Ok(x) => {
                        ids.insert(id, x.addr);
                    }
                    Err(err) => {
                        println!("fail at {i} size {size}: {err}\n{}", p.debug_state());
                        return;
                    }
                }
            }
            Event::Free { id, mode } => {
                let _ = p.free(&mut dev, ids.remove(&id).unwrap(), mode);
            }
            _ => {}
        }
    }
    println!("completed {}", p.debug_state());
}
