//! Sizes from input files reach the policies unchecked (a log row of 2^64-1 bytes): every
//! policy refuses a request past `MAX_REQUEST` as out of memory, and nothing overflows on the
//! way (the caching policy's rounding wrapped such a size to a tiny block and then panicked).

use vramshim_pool::replay::{self, Event};
use vramshim_pool::{FreeMode, MAX_REQUEST, PolicyKind};

#[test]
fn every_policy_refuses_sizes_past_the_largest_request() {
    for size in [u64::MAX, u64::MAX - 511, MAX_REQUEST + 1] {
        let events = [
            Event::Alloc {
                id: 1,
                size: 4096,
                stream: 0,
            },
            Event::Alloc {
                id: 2,
                size,
                stream: 0,
            },
            Event::Free {
                id: 1,
                mode: FreeMode::Sync,
            },
        ];
        for p in PolicyKind::ALL {
            let r = replay::run(&events, p, 80 << 30, None);
            assert!(!r.completed, "{p} served {size}");
            assert_eq!(r.allocs_done, 1, "{p}");
            let f = r.first_failure.expect("a failure");
            assert_eq!(f.size, size, "{p}");
            assert!(f.why.contains("out of memory"), "{p}: {}", f.why);
            assert_eq!(replay::peak_live(&events), size.saturating_add(4096), "{p}");
        }
    }
}
