//! Kubernetes names for the exporter's labels. A process's cgroup gives only its pod's UID
//! and its container's id; the kubelet names both in its log directories, which the
//! exporter (run on the node) lists:
//! - `<root>/pods/<namespace>_<pod-name>_<pod-uid>/` (one directory per pod);
//! - `<root>/containers/<pod-name>_<namespace>_<container-name>-<container-id>.log` (one link
//!   per container, to its log in the pod's directory).
//!
//! Only the names are read (`readdir`), never a file and never a link's target, so nothing
//! is followed. The two directories must be real directories (not links) owned by root or
//! by the exporter's user and writable by nobody else: entries planted by another user could
//! otherwise put any names on a process's series. Each is opened once (`openat` with
//! `O_NOFOLLOW` under the root), checked on the open descriptor and read through it, so a
//! directory swapped after the check is not the one read. At most [`MAX_ENTRIES`] entries are read
//! per directory (bounded memory and time per scrape); names that do not parse are skipped.

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// The kubelet's log root on a node.
pub const DEFAULT_ROOT: &str = "/var/log";
/// Entries read per directory at most (a node runs at most a few hundred pods).
pub const MAX_ENTRIES: usize = 65_536;

/// A pod's names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pod {
    pub namespace: String,
    pub name: String,
}

/// What the kubelet's directories say.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Names {
    /// By pod UID (with dashes, as the cgroup path gives it once unescaped).
    pub pods: HashMap<String, Pod>,
    /// Container name by container id (64 hex digits).
    pub containers: HashMap<String, String>,
}

impl Names {
    pub fn pod(&self, uid: &str) -> Option<&Pod> {
        if uid.is_empty() {
            return None;
        }
        self.pods.get(uid)
    }

    pub fn container(&self, id: &str) -> Option<&str> {
        if id.is_empty() {
            return None;
        }
        self.containers.get(id).map(String::as_str)
    }
}

/// A directory opened once, for names: `openat(root, name, O_DIRECTORY | O_NOFOLLOW)`, then
/// checked on the open descriptor (`fstat`) and read through it (`fdopendir`), so what is
/// checked is what is read: swapping the directory for a link or another directory after
/// the check changes nothing.
struct Dir {
    /// Owns the descriptor it was opened with (`closedir` closes both).
    dir: std::ptr::NonNull<libc::DIR>,
}

impl Dir {
    /// Opens `root/name` (`name`: one path component) and checks it: a directory (not a
    /// link), owned by root or by us, without write permission for group or others.
    /// `Ok(None)`: it does not exist (not a Kubernetes node). `Err`: the one line saying why
    /// it is not used.
    fn open_trusted(root: &Path, name: &str) -> Result<Option<Dir>, String> {
        use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd, OwnedFd};
        let path = root.join(name);
        let root_dir = match std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECTORY | libc::O_CLOEXEC)
            .open(root)
        {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(format!("{}: cannot open it: {e}", root.display())),
        };
        let cname = std::ffi::CString::new(name).map_err(|_| format!("{name:?}: a NUL byte"))?;
        // SAFETY: the descriptor is open for the call and the name is a NUL-terminated string.
        let fd = unsafe {
            libc::openat(
                root_dir.as_raw_fd(),
                cname.as_ptr(),
                libc::O_RDONLY
                    | libc::O_DIRECTORY
                    | libc::O_NOFOLLOW
                    | libc::O_NONBLOCK
                    | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            let e = std::io::Error::last_os_error();
            return match e.raw_os_error() {
                Some(libc::ENOENT) => Ok(None),
                // O_NOFOLLOW on a link; O_DIRECTORY on anything else.
                Some(libc::ELOOP) | Some(libc::ENOTDIR) => Err(format!(
                    "{} is not a directory (a link or a file); not reading pod names from it",
                    path.display()
                )),
                _ => Err(format!("{}: cannot open it: {e}", path.display())),
            };
        }
        // SAFETY: openat returned a new descriptor that nothing else owns.
        let file = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fd) });
        let meta = file
            .metadata()
            .map_err(|e| format!("{}: cannot stat it: {e}", path.display()))?;
        trusted(&path, &meta)?;
        let fd = file.into_raw_fd();
        // SAFETY: fd is an open directory descriptor that we own; on success the stream owns it.
        match std::ptr::NonNull::new(unsafe { libc::fdopendir(fd) }) {
            Some(dir) => Ok(Some(Dir { dir })),
            None => {
                let e = std::io::Error::last_os_error();
                // SAFETY: fdopendir failed, so the descriptor is still ours to close.
                unsafe { libc::close(fd) };
                Err(format!("{}: cannot read it: {e}", path.display()))
            }
        }
    }

    /// The names of up to [`MAX_ENTRIES`] entries (`dirs_only`: directories only, by the
    /// entry's own type, never following a link).
    fn names(&mut self, dirs_only: bool) -> Vec<String> {
        let mut out = Vec::new();
        let mut seen = 0;
        while seen < MAX_ENTRIES {
            // SAFETY: the stream is open (closed only on drop) and used by this thread only.
            let ent = unsafe { libc::readdir(self.dir.as_ptr()) };
            if ent.is_null() {
                break;
            }
            // SAFETY: readdir returned an entry valid until the next call on this stream;
            // d_name is NUL-terminated.
            let (name, kind) = unsafe {
                (
                    std::ffi::CStr::from_ptr((*ent).d_name.as_ptr()),
                    (*ent).d_type,
                )
            };
            let name = name.to_bytes();
            if name == b"." || name == b".." {
                continue;
            }
            seen += 1;
            if dirs_only && !self.is_dir(name, kind) {
                continue;
            }
            if let Ok(n) = std::str::from_utf8(name) {
                out.push(n.to_string());
            }
        }
        out
    }

    /// Whether entry `name` is a directory (not a link to one): its type from `readdir`, or
    /// where the file system does not give it, `fstatat` without following links.
    fn is_dir(&self, name: &[u8], kind: u8) -> bool {
        if kind != libc::DT_UNKNOWN {
            return kind == libc::DT_DIR;
        }
        let Ok(c) = std::ffi::CString::new(name) else {
            return false;
        };
        let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
        // SAFETY: the stream's descriptor is open, the name is NUL-terminated and `st` is
        // large enough for the answer.
        let r = unsafe {
            libc::fstatat(
                libc::dirfd(self.dir.as_ptr()),
                c.as_ptr(),
                st.as_mut_ptr(),
                libc::AT_SYMLINK_NOFOLLOW,
            )
        };
        // SAFETY: fstatat succeeded, so it filled `st`.
        r == 0 && unsafe { st.assume_init() }.st_mode & libc::S_IFMT == libc::S_IFDIR
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        // SAFETY: the stream was opened by fdopendir and is closed once, here.
        unsafe { libc::closedir(self.dir.as_ptr()) };
    }
}

/// Whether the directory at `path` whose open descriptor gave `meta` may be trusted for
/// names: owned by root or by us, without write permission for group or others. `Err`: the
/// one line saying why it is not used.
fn trusted(path: &Path, meta: &std::fs::Metadata) -> Result<(), String> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let me = unsafe { libc::geteuid() };
    if meta.uid() != 0 && meta.uid() != me {
        return Err(format!(
            "{} belongs to uid {}, neither root nor this user; not reading pod names from it",
            path.display(),
            meta.uid()
        ));
    }
    if meta.mode() & 0o022 != 0 {
        return Err(format!(
            "{} is writable by group or others (mode {:o}); not reading pod names from it",
            path.display(),
            meta.mode() & 0o7777
        ));
    }
    Ok(())
}

/// `<namespace>_<pod-name>_<pod-uid>`: namespaces and pod names are DNS names (no `_`).
fn parse_pod_dir(name: &str) -> Option<(String, Pod)> {
    let mut it = name.split('_');
    let (ns, pod, uid) = (it.next()?, it.next()?, it.next()?);
    if it.next().is_some() || !dns_name(ns) || !dns_name(pod) || !pod_uid(uid) {
        return None;
    }
    Some((
        uid.to_string(),
        Pod {
            namespace: ns.to_string(),
            name: pod.to_string(),
        },
    ))
}

/// `<pod-name>_<namespace>_<container-name>-<64 hex>.log` -> (id, container name).
fn parse_container_log(name: &str) -> Option<(String, String)> {
    let stem = name.strip_suffix(".log")?;
    let mut it = stem.split('_');
    let (pod, ns, rest) = (it.next()?, it.next()?, it.next()?);
    if it.next().is_some() || !dns_name(pod) || !dns_name(ns) {
        return None;
    }
    let (container, id) = rest.rsplit_once('-')?;
    if id.len() != 64 || !id.bytes().all(|b| b.is_ascii_hexdigit()) || !dns_name(container) {
        return None;
    }
    Some((id.to_ascii_lowercase(), container.to_string()))
}

/// A DNS subdomain as Kubernetes allows in names: 1 to 253 of `a-z 0-9 - .`.
fn dns_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
}

/// A pod UID: 36 characters of hex digits and dashes.
fn pod_uid(s: &str) -> bool {
    s.len() == 36 && s.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-')
}

/// Reads the names under `root` (`pods/` and `containers/`). The strings are the lines to say
/// about directories not used (once, by the caller).
pub fn read(root: &Path) -> (Names, Vec<String>) {
    read_with(root, &|_| {})
}

/// [`read`], calling `between(dir)` after checking each directory and before reading it (the
/// tests swap the directory there).
fn read_with(root: &Path, between: &dyn Fn(&str)) -> (Names, Vec<String>) {
    let mut out = Names::default();
    let mut said = Vec::new();
    match Dir::open_trusted(root, "pods") {
        Ok(Some(mut d)) => {
            between("pods");
            for n in d.names(true) {
                if let Some((uid, pod)) = parse_pod_dir(&n) {
                    out.pods.insert(uid, pod);
                }
            }
        }
        Ok(None) => {}
        Err(e) => said.push(e),
    }
    match Dir::open_trusted(root, "containers") {
        Ok(Some(mut d)) => {
            between("containers");
            for n in d.names(false) {
                if let Some((id, name)) = parse_container_log(&n) {
                    out.containers.insert(id, name);
                }
            }
        }
        Ok(None) => {}
        Err(e) => said.push(e),
    }
    (out, said)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    const UID: &str = "0b7d8f3c-5a1e-4c2b-9d6f-1e2a3b4c5d6e";
    const CID: &str = "4f1e2d3c4b5a69788796a5b4c3d2e1f0a1b2c3d4e5f60718293a4b5c6d7e8f90";

    fn tree(tag: &str) -> vramshim_testkit::TempDir {
        let root = vramshim_testkit::TempDir::new(&format!("kube-{tag}"));
        std::fs::create_dir_all(root.join("pods")).unwrap();
        std::fs::create_dir_all(root.join("containers")).unwrap();
        for d in ["pods", "containers"] {
            std::fs::set_permissions(root.join(d), std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        root
    }

    #[test]
    fn names_from_the_kubelets_directories() {
        let root = tree("names");
        let pod_dir = root.join(format!("pods/ml-team_trainer-7f9c_{UID}"));
        std::fs::create_dir_all(pod_dir.join("pytorch")).unwrap();
        std::fs::write(pod_dir.join("pytorch/0.log"), b"").unwrap();
        std::os::unix::fs::symlink(
            pod_dir.join("pytorch/0.log"),
            root.join(format!("containers/trainer-7f9c_ml-team_pytorch-{CID}.log")),
        )
        .unwrap();
        // Not pods: a file, malformed names, a link to a directory.
        std::fs::write(root.join(format!("pods/a_b_{UID}x")), b"").unwrap();
        std::fs::create_dir_all(root.join("pods/no_uid_here")).unwrap();
        std::fs::create_dir_all(root.join("elsewhere")).unwrap();
        std::os::unix::fs::symlink(
            root.join("elsewhere"),
            root.join("pods/evil_pod_11111111-2222-3333-4444-555555555555"),
        )
        .unwrap();
        let (n, said) = read(&root);
        assert!(said.is_empty(), "{said:?}");
        assert_eq!(
            n.pod(UID),
            Some(&Pod {
                namespace: "ml-team".into(),
                name: "trainer-7f9c".into()
            })
        );
        assert_eq!(n.pods.len(), 1, "{:?}", n.pods);
        assert_eq!(n.container(CID), Some("pytorch"));
        assert_eq!(n.pod(""), None);
    }

    /// Directories anyone may write to, or links standing for them, are not read; a missing
    /// root is silent (not a Kubernetes node).
    #[test]
    fn untrusted_directories_are_refused_with_one_line_each() {
        let root = tree("untrusted");
        std::fs::create_dir_all(root.join(format!("pods/ns_p_{UID}"))).unwrap();
        std::fs::set_permissions(root.join("pods"), std::fs::Permissions::from_mode(0o777))
            .unwrap();
        std::fs::remove_dir_all(root.join("containers")).unwrap();
        std::fs::create_dir_all(root.join("real")).unwrap();
        std::os::unix::fs::symlink(root.join("real"), root.join("containers")).unwrap();
        let (n, said) = read(&root);
        assert!(n.pods.is_empty() && n.containers.is_empty());
        assert_eq!(said.len(), 2, "{said:?}");
        assert!(said[0].contains("writable by group or others"), "{said:?}");
        assert!(said[1].contains("not a directory"), "{said:?}");
        let (n, said) = read(&root.join("nothing-here"));
        assert_eq!((n, said), (Names::default(), Vec::<String>::new()));
    }

    /// What is checked is what is read: a directory swapped for a link to another user's
    /// directory between the check and the reading (the check passed on the real one) puts
    /// none of the planted names on the series.
    #[test]
    fn a_directory_swapped_after_the_check_is_not_read() {
        let root = tree("swap");
        std::fs::create_dir_all(root.join(format!("pods/ml-team_trainer_{UID}"))).unwrap();
        let evil = root.join("evil");
        let evil_uid = "11111111-2222-3333-4444-555555555555";
        let evil_cid = "ab".repeat(32);
        std::fs::create_dir_all(evil.join(format!("attacker_spoofed_{evil_uid}"))).unwrap();
        std::fs::create_dir_all(evil.join(format!("spoofed_attacker_fake-{evil_cid}.log")))
            .unwrap();
        std::fs::write(
            evil.join(format!("spoofed_attacker_fake-{evil_cid}.log/x")),
            b"",
        )
        .unwrap();
        // The real directories move away and links to the planted one take their names.
        let swap = |dir: &str| {
            std::fs::rename(root.join(dir), root.join(format!("{dir}.old"))).unwrap();
            std::os::unix::fs::symlink(&evil, root.join(dir)).unwrap();
        };
        let (n, said) = read_with(&root, &swap);
        assert!(said.is_empty(), "{said:?}");
        assert_eq!(n.pod(evil_uid), None, "planted pod read: {:?}", n.pods);
        assert_eq!(n.container(&evil_cid), None, "{:?}", n.containers);
        assert_eq!(n.pod(UID).map(|p| p.name.as_str()), Some("trainer"));
    }

    #[test]
    fn name_forms() {
        assert!(parse_pod_dir(&format!("kube-system_coredns-abc_{UID}")).is_some());
        assert!(parse_pod_dir(&format!("Kube_x_{UID}")).is_none());
        assert!(parse_pod_dir(&format!("a_b_c_{UID}")).is_none());
        assert!(parse_container_log(&format!("p_ns_c-{CID}.log")).is_some());
        assert!(parse_container_log(&format!("p_ns_c-{CID}")).is_none());
        assert!(parse_container_log("p_ns_c-abc.log").is_none());
        assert_eq!(
            parse_container_log(&format!("p_ns_my-sidecar-{CID}.log")).map(|x| x.1),
            Some("my-sidecar".into())
        );
    }
}
