//! Process identity: pid + start time (field 22 of `/proc/<pid>/stat`), so that a reused pid
//! is never mistaken for the process that held a slot.

/// A process, packed into one word: pid in bits 0..32, the low 31 bits of its start time (clock
/// ticks since boot) in bits 32..63. Bit 63 is left free for the slot's "being reclaimed" flag.
/// Never 0 (pids start at 1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ProcessKey(u64);

const START_MASK: u64 = (1 << 31) - 1;

impl ProcessKey {
    pub fn new(pid: u32, start_ticks: u64) -> ProcessKey {
        ProcessKey(u64::from(pid) | ((start_ticks & START_MASK) << 32))
    }

    /// The calling process (None only if `/proc` is unreadable).
    pub fn current() -> Option<ProcessKey> {
        let pid = std::process::id();
        let (start, _) = stat(pid)?;
        Some(ProcessKey::new(pid, start))
    }

    pub(crate) fn from_word(w: u64) -> Option<ProcessKey> {
        let k = w & !crate::REAP_FLAG;
        (k != 0).then_some(ProcessKey(k))
    }

    pub fn word(self) -> u64 {
        self.0
    }

    pub fn pid(self) -> u32 {
        self.0 as u32
    }

    pub fn start_low(self) -> u64 {
        (self.0 >> 32) & START_MASK
    }

    /// Whether this process still runs: `/proc/<pid>` exists, is not a zombie, and (when
    /// `check_start`) started at the recorded time.
    pub fn alive(self, check_start: bool) -> bool {
        match stat(self.pid()) {
            Some((start, state)) => {
                state != 'Z'
                    && state != 'X'
                    && (!check_start || start & START_MASK == self.start_low())
            }
            None => false,
        }
    }
}

impl ProcessKey {
    /// Whether this process surely no longer runs: `/proc/<pid>` does not exist, is a zombie,
    /// or started at another time. Any other failure to read it (out of descriptors, a
    /// `/proc` mounted with `hidepid`) reads as alive: where being wrong would let two
    /// processes write one record, only proof of death counts.
    pub fn is_dead(self) -> bool {
        match std::fs::read_to_string(format!("/proc/{}/stat", self.pid())) {
            Ok(text) => match parse_stat(&text) {
                Some((start, state)) => {
                    state == 'Z' || state == 'X' || start & START_MASK != self.start_low()
                }
                None => false,
            },
            Err(e) => e.kind() == std::io::ErrorKind::NotFound,
        }
    }
}

/// (start time in clock ticks, state) of `pid` from `/proc/<pid>/stat`.
pub fn stat(pid: u32) -> Option<(u64, char)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_stat(&text)
}

/// Parses a `/proc/<pid>/stat` line: the command may contain spaces and ')', so fields are
/// counted after the last ')'. Field 3 is the state, field 22 the start time.
pub fn parse_stat(text: &str) -> Option<(u64, char)> {
    let rest = text.get(text.rfind(')')? + 1..)?;
    let mut fields = rest.split_ascii_whitespace();
    let state = fields.next()?.chars().next()?;
    let start = fields.nth(18)?.parse().ok()?;
    Some((start, state))
}

/// The command name of `pid` (`/proc/<pid>/comm`), for display.
pub fn comm(pid: u32) -> Option<String> {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .ok()
        .map(|s| s.trim_end().to_string())
}

/// Identifier of the calling process's pid namespace (inode of `/proc/self/ns/pid`), 0 if unknown.
pub fn pid_namespace() -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self/ns/pid")
        .map(|m| m.ino())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_stat_with_odd_command_names() {
        let line =
            "1234 (a) b) (c) S 1 1234 1234 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 10";
        assert_eq!(parse_stat(line), Some((987654, 'S')));
        assert_eq!(parse_stat("garbage"), None);
        assert_eq!(parse_stat("1 (x) Z 1 2"), None);
    }

    #[test]
    fn current_process_is_alive_and_a_wrong_start_time_is_not() {
        let me = ProcessKey::current().unwrap();
        assert_eq!(me.pid(), std::process::id());
        assert!(me.alive(true));
        let impostor = ProcessKey::new(me.pid(), me.start_low() + 1);
        assert!(
            !impostor.alive(true),
            "a reused pid with another start time must read as dead"
        );
        assert!(
            impostor.alive(false),
            "without the start-time check the pid alone fools it"
        );
        assert!(!ProcessKey::new(u32::MAX - 1, 0).alive(true));
    }

    #[test]
    fn only_proof_of_death_reads_as_dead() {
        let me = ProcessKey::current().unwrap();
        assert!(!me.is_dead());
        assert!(ProcessKey::new(me.pid(), me.start_low() + 1).is_dead());
        let mut child = std::process::Command::new("sleep")
            .arg("60")
            .spawn()
            .unwrap();
        let pid = child.id();
        let (start, _) = stat(pid).unwrap();
        let key = ProcessKey::new(pid, start);
        assert!(!key.is_dead(), "a running child");
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(key.is_dead(), "a reaped child");
    }

    #[test]
    fn key_packing() {
        let k = ProcessKey::new(4_194_304, (1 << 40) | 77);
        assert_eq!(k.pid(), 4_194_304);
        assert_eq!(k.start_low(), 77);
        assert_eq!(k.word() & crate::REAP_FLAG, 0);
        assert_eq!(ProcessKey::from_word(k.word() | crate::REAP_FLAG), Some(k));
        assert_eq!(ProcessKey::from_word(0), None);
    }
}
