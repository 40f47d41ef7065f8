//! Opening the files vramshim writes (traces, reports, exports) so that nothing another user
//! planted at the path is followed, blocked on or written through. This is the crate's OS
//! layer: its only FFI is `geteuid`.
//!
//! The rule (docs/threat-model.md):
//! - a symbolic link at the path is never followed (`O_NOFOLLOW`, and an `lstat` first);
//! - anything but a regular file (FIFO, socket, device, directory) is refused before it is
//!   opened, and the file that is opened is checked again on its descriptor (`fstat`), opened
//!   with `O_NONBLOCK | O_NOCTTY`, so a FIFO swapped in between never blocks us;
//! - a new file is created with `O_CREAT | O_EXCL` (nothing planted in the meantime is
//!   reused);
//! - an existing file is written only if this user (the effective uid) owns it, it has one
//!   link, and, for a trace or another output with a mark of its own ([`Replace::Marked`]),
//!   it is empty or starts with that mark (a trace: the `.vramtrace` magic). It is truncated only after these checks, on the descriptor that
//!   was checked.
//!
//! Directories above the last component are resolved as given: the user chose them.

use std::fmt;
use std::fs::{File, Metadata, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom};
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::Path;

use crate::header::MAGIC;

/// What an existing file at the path may be, to be replaced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Replace {
    /// An earlier output of the same kind: a file of ours that is empty or starts with these
    /// bytes (the tracer's rule, with [`TRACE`]: `VRAMSHIM_TRACE=/etc/passwd` must not
    /// destroy anything).
    Marked(&'static [u8]),
    /// Any regular file of ours (what `-o FILE` means to every command-line tool).
    OwnFile,
}

/// [`Replace::Marked`] by the `.vramtrace` magic: only an earlier trace is replaced.
pub const TRACE: Replace = Replace::Marked(&MAGIC);

/// Why a path was not opened for writing.
#[derive(Debug)]
pub enum Refusal {
    /// A symbolic link is at the path.
    Symlink,
    /// Something that is not a regular file is at the path ("a FIFO", "a directory", ...).
    NotRegular(&'static str),
    /// A file of another user is at the path.
    ForeignOwner { owner: u32, me: u32 },
    /// A file with other names (hard links) is at the path.
    HardLinked(u64),
    /// A file without the expected mark (these bytes) is at the path ([`Replace::Marked`]).
    NotOurs(&'static [u8]),
    /// The path kept changing under us (entries planted and removed in a loop).
    Unstable,
    /// The system refused (permission, missing directory, disk full, ...).
    Io(io::Error),
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::Symlink => write!(f, "is a symbolic link (never followed)"),
            Refusal::NotRegular(k) => write!(f, "is {k}, not a regular file"),
            Refusal::ForeignOwner { owner, me } => write!(
                f,
                "belongs to uid {owner}, not to this user (uid {me}); another user's file is never written through"
            ),
            Refusal::HardLinked(n) => write!(
                f,
                "has {n} hard links; a file with other names is never written through"
            ),
            Refusal::NotOurs(mark) => {
                let kind = if *mark == MAGIC {
                    "not a .vramtrace".to_string()
                } else {
                    format!("it does not start with {:?}", String::from_utf8_lossy(mark))
                };
                write!(
                    f,
                    "exists and is not an earlier output of this kind ({kind}); it is not overwritten (remove it or choose another path)"
                )
            }
            Refusal::Unstable => write!(f, "kept changing while it was being opened"),
            Refusal::Io(e) => write!(f, "cannot be opened for writing: {e}"),
        }
    }
}

impl std::error::Error for Refusal {}

impl From<io::Error> for Refusal {
    fn from(e: io::Error) -> Self {
        // ELOOP from O_NOFOLLOW: a symbolic link appeared at the path.
        if e.raw_os_error() == Some(libc::ELOOP) {
            Refusal::Symlink
        } else {
            Refusal::Io(e)
        }
    }
}

impl From<Refusal> for io::Error {
    fn from(r: Refusal) -> Self {
        match r {
            Refusal::Io(e) => e,
            r => io::Error::new(io::ErrorKind::PermissionDenied, r.to_string()),
        }
    }
}

/// An output opened by [`open`]: created by us, or an existing file that passed the checks
/// (not truncated yet, positioned at its start).
#[derive(Debug)]
pub enum Opened {
    Created(File),
    Existing(File),
}

impl Opened {
    /// The file, emptied if it existed.
    pub fn truncate(self) -> io::Result<File> {
        match self {
            Opened::Created(f) => Ok(f),
            Opened::Existing(mut f) => {
                f.set_len(0)?;
                f.seek(SeekFrom::Start(0))?;
                Ok(f)
            }
        }
    }
}

/// The effective uid: the owner of the files this process creates.
pub fn effective_uid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// What kind of non-regular file `m` describes ("a FIFO", ...), `None` for a regular file.
fn not_regular(m: &Metadata) -> Option<&'static str> {
    let t = m.file_type();
    if t.is_file() {
        None
    } else if t.is_symlink() {
        Some("a symbolic link")
    } else if t.is_fifo() {
        Some("a FIFO")
    } else if t.is_socket() {
        Some("a socket")
    } else if t.is_char_device() {
        Some("a character device")
    } else if t.is_block_device() {
        Some("a block device")
    } else if t.is_dir() {
        Some("a directory")
    } else {
        Some("not a file")
    }
}

fn check_type(m: &Metadata) -> Result<(), Refusal> {
    if m.file_type().is_symlink() {
        return Err(Refusal::Symlink);
    }
    match not_regular(m) {
        Some(k) => Err(Refusal::NotRegular(k)),
        None => Ok(()),
    }
}

/// `O_NOFOLLOW` (never through a symlink), `O_NONBLOCK` (never wait on a FIFO swapped in
/// after the `lstat`), `O_NOCTTY` (never take a terminal).
const FLAGS: i32 = libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY;

/// Opens `path` for writing under the rules of this module (see the module docs); an
/// existing file is returned unchanged for the caller to inspect, then [`Opened::truncate`].
/// New files get mode 0666 less the umask, as any file.
pub fn open(path: &Path, replace: Replace) -> Result<Opened, Refusal> {
    // An entry planted and removed in a loop could keep us going round; a few rounds are
    // enough for any honest race.
    for _ in 0..8 {
        let m = match std::fs::symlink_metadata(path) {
            Ok(m) => m,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                match OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o666)
                    .custom_flags(FLAGS)
                    .open(path)
                {
                    Ok(f) => {
                        check_type(&f.metadata()?)?;
                        return Ok(Opened::Created(f));
                    }
                    // Planted between the lstat and the open: look at it again.
                    Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                    Err(e) => return Err(e.into()),
                }
            }
            Err(e) => return Err(e.into()),
        };
        // Refuse what is not a regular file before opening it (opening a device can act).
        check_type(&m)?;
        let mut f = match OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(FLAGS)
            .open(path)
        {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e.into()),
        };
        let m = f.metadata()?;
        check_type(&m)?;
        let me = effective_uid();
        if m.uid() != me {
            return Err(Refusal::ForeignOwner { owner: m.uid(), me });
        }
        if m.nlink() > 1 {
            return Err(Refusal::HardLinked(m.nlink()));
        }
        if let Replace::Marked(mark) = replace
            && m.len() > 0
        {
            let mut head = vec![0u8; mark.len()];
            let n = read_up_to(&mut f, &mut head)?;
            // A file cut short inside its mark is still an output of ours.
            if n == 0 || head[..n] != mark[..n] {
                return Err(Refusal::NotOurs(mark));
            }
            f.seek(SeekFrom::Start(0))?;
        }
        return Ok(Opened::Existing(f));
    }
    Err(Refusal::Unstable)
}

/// [`open`], then [`Opened::truncate`]: the file to write, empty.
pub fn create(path: &Path, replace: Replace) -> Result<File, Refusal> {
    Ok(open(path, replace)?.truncate()?)
}

fn read_up_to(f: &mut File, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match f.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn dir(tag: &str) -> vramshim_testkit::TempDir {
        vramshim_testkit::TempDir::new(&format!("output-file-{tag}"))
    }

    #[test]
    fn creates_a_new_file_and_replaces_a_trace() {
        let d = dir("new");
        let p = d.join("t.vramtrace");
        assert!(matches!(open(&p, TRACE), Ok(Opened::Created(_))));
        std::fs::write(&p, [&MAGIC[..], b"rest"].concat()).unwrap();
        let f = create(&p, TRACE).unwrap();
        assert_eq!(f.metadata().unwrap().len(), 0);
        // An empty file, and a trace cut inside its magic, are traces of ours too.
        create(&p, TRACE).unwrap();
        std::fs::write(&p, &MAGIC[..3]).unwrap();
        create(&p, TRACE).unwrap();
    }

    #[test]
    fn refuses_symlinks_fifos_other_files_and_hard_links() {
        let d = dir("refuse");
        let victim = d.join("victim");
        std::fs::write(&victim, "precious").unwrap();
        let link = d.join("link");
        symlink(&victim, &link).unwrap();
        for r in [TRACE, Replace::OwnFile] {
            assert!(matches!(open(&link, r), Err(Refusal::Symlink)), "{r:?}");
        }
        let dangling = d.join("dangling");
        symlink(d.join("nowhere"), &dangling).unwrap();
        assert!(matches!(
            open(&dangling, Replace::OwnFile),
            Err(Refusal::Symlink)
        ));
        assert!(!d.join("nowhere").exists());
        let e = open(&victim, TRACE).unwrap_err();
        assert!(e.to_string().contains("not a .vramtrace"), "{e}");
        let stats = Replace::Marked(b"{\"pid\":");
        let e = open(&victim, stats).unwrap_err();
        assert!(e.to_string().contains("{\\\"pid\\\":"), "{e}");
        assert!(!e.to_string().contains("vramtrace"), "{e}");
        assert!(matches!(
            open(&d, Replace::OwnFile),
            Err(Refusal::NotRegular("a directory"))
        ));
        let fifo = d.join("fifo");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        assert!(matches!(
            open(&fifo, Replace::OwnFile),
            Err(Refusal::NotRegular("a FIFO"))
        ));
        std::fs::hard_link(&victim, d.join("other-name")).unwrap();
        assert!(matches!(
            open(&victim, Replace::OwnFile),
            Err(Refusal::HardLinked(2))
        ));
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
        std::fs::remove_file(d.join("other-name")).unwrap();
        // The CLI rule: a plain file of ours is replaced.
        create(&victim, Replace::OwnFile).unwrap();
        assert_eq!(std::fs::read(&victim).unwrap().len(), 0);
    }
}
