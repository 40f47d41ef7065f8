//! `CUDA_VISIBLE_DEVICES`: which physical devices this process sees, in which order.
//!
//! A real driver reads the variable once, at `cuInit`, and from then on every ordinal the
//! process uses names a position in that list; the devices themselves (their memory, their
//! PCI bus ids, their UUIDs) stay physical, so NVML, which ignores the variable, numbers them
//! differently. Interposers that confuse the two numberings charge the wrong device
//! (HAMi-core #1218), so the simulator must keep them apart as a real machine does.
//!
//! The parsing follows the driver's documented behaviour (and PyTorch's model of it in
//! `torch.cuda._parse_visible_devices`): a comma-separated list of indices or UUIDs
//! (`GPU-` followed by a unique prefix of the UUID); an index is read like `strtoul` (leading
//! digits, the rest of the entry ignored); the list ends at the first entry that is not a
//! device (a negative or out-of-range index, an unknown or ambiguous UUID); a device named
//! twice makes the whole list empty. Unset: every device, in order. Set but empty: none.

/// The physical indices visible to this process, in ordinal order.
pub fn parse(spec: Option<&str>, physical: u32, uuid_of: &dyn Fn(u32) -> String) -> Vec<u32> {
    let Some(spec) = spec else {
        return (0..physical).collect();
    };
    let mut seen = Vec::new();
    for entry in spec.split(',') {
        let entry = entry.trim();
        let dev = if entry.starts_with("GPU-") {
            by_uuid_prefix(entry, physical, uuid_of)
        } else {
            by_index(entry).filter(|&i| i < physical)
        };
        let Some(dev) = dev else { break };
        if seen.contains(&dev) {
            return Vec::new();
        }
        seen.push(dev);
    }
    seen
}

fn by_index(entry: &str) -> Option<u32> {
    let digits = entry.bytes().take_while(u8::is_ascii_digit).count();
    entry[..digits].parse().ok()
}

fn by_uuid_prefix(prefix: &str, physical: u32, uuid_of: &dyn Fn(u32) -> String) -> Option<u32> {
    let mut hits = (0..physical).filter(|&d| uuid_of(d).starts_with(prefix));
    let first = hits.next()?;
    hits.next().is_none().then_some(first)
}

#[cfg(test)]
mod tests {
    use super::parse;

    fn uuid(d: u32) -> String {
        format!("GPU-{d}{d}a0b1c2-0000-0000-0000-00000000000{d}")
    }

    fn p(s: Option<&str>) -> Vec<u32> {
        parse(s, 4, &uuid)
    }

    #[test]
    fn unset_means_every_device_and_empty_means_none() {
        assert_eq!(p(None), vec![0, 1, 2, 3]);
        assert_eq!(p(Some("")), Vec::<u32>::new());
    }

    #[test]
    fn indices_reorder_and_stop_at_the_first_invalid_entry() {
        assert_eq!(p(Some("2,0")), vec![2, 0]);
        assert_eq!(p(Some("0,2,-1,1")), vec![0, 2]);
        assert_eq!(p(Some("1,7,0")), vec![1]);
        assert_eq!(p(Some(" 3 , 1")), vec![3, 1]);
        assert_eq!(p(Some("1gpu,2ampere")), vec![1, 2]);
        assert_eq!(p(Some("x,1")), Vec::<u32>::new());
    }

    #[test]
    fn a_device_named_twice_hides_every_device() {
        assert_eq!(p(Some("0,1,0")), Vec::<u32>::new());
        assert_eq!(p(Some("GPU-22,2")), Vec::<u32>::new());
    }

    #[test]
    fn uuid_prefixes_must_be_unique() {
        assert_eq!(p(Some("GPU-33a0,GPU-11")), vec![3, 1]);
        assert_eq!(p(Some("GPU-,0")), Vec::<u32>::new());
        assert_eq!(p(Some("GPU-99")), Vec::<u32>::new());
    }
}
