use vramshim_pool::replay::{self, Event};
use vramshim_pool::stitch::Stitch;
use vramshim_pool::{AccountingDevice, Policy, Request, rmm_csv};
fn main() {
    let a: Vec<String> = std::env::args().collect();
    let t = rmm_csv::parse_file(&a[1]).unwrap();
    let passes: usize = a.get(2).map(|x| x.parse().unwrap()).unwrap_or(3);
    let one = replay::repeat(&t.events, 1).len();
    let all = replay::repeat(&t.events, passes);
    let mut dev = AccountingDevice::new(1 << 50);
    let mut p = Stitch::new();
    let mut ids = std::collections::HashMap::new();
    for pass in 0..passes {
        let before = dev.calls();
        let st = p.stats();
        for e in &all[pass * one..(pass + 1) * one] {
            match *e {
                Event::Alloc { id, size, stream } => {
                    let x = p.alloc(&mut dev, Request { size, stream }).unwrap();
                    ids.insert(id, x.addr);
                }
                Event::Free { id, mode } => {
                    p.free(&mut dev, ids.remove(&id).unwrap(), mode).unwrap();
                }
                _ => {}
            }
        }
        let c = dev.calls().since(&before);
        let s2 = p.stats();
        println!(
            "pass {pass}: {:?}\n  hits {} of {} ; {}",
            c,
            s2.cache_hits - st.cache_hits,
            s2.allocs - st.allocs,
            p.debug_state()
        );
    }
}
