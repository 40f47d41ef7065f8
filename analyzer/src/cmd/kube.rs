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
//! otherwise put any names on a process's series. At most [`MAX_ENTRIES`] entries are read
//! per directory (bounded memory and time per scrape); names that do not parse are skipped.

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

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

/// Whether `dir` may be trusted for names: a directory (not a link), owned by root or by
/// us, without write permission for group or others. `Ok(false)`: it does not exist (not a
/// Kubernetes node). `Err`: the one line saying why it is not used.
fn trusted(dir: &Path) -> Result<bool, String> {
    let meta = match std::fs::symlink_metadata(dir) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(format!("{}: cannot stat it: {e}", dir.display())),
    };
    if !meta.file_type().is_dir() {
        return Err(format!(
            "{} is not a directory (a link or a file); not reading pod names from it",
            dir.display()
        ));
    }
    // SAFETY: geteuid has no preconditions and cannot fail.
    let me = unsafe { libc::geteuid() };
    if meta.uid() != 0 && meta.uid() != me {
        return Err(format!(
            "{} belongs to uid {}, neither root nor this user; not reading pod names from it",
            dir.display(),
            meta.uid()
        ));
    }
    if meta.mode() & 0o022 != 0 {
        return Err(format!(
            "{} is writable by group or others (mode {:o}); not reading pod names from it",
            dir.display(),
            meta.mode() & 0o7777
        ));
    }
    Ok(true)
}

/// The names of up to [`MAX_ENTRIES`] entries of `dir` (`dirs_only`: directories only, by
/// the entry's own type, never following a link).
fn entries(dir: &Path, dirs_only: bool) -> Vec<String> {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    rd.take(MAX_ENTRIES)
        .flatten()
        .filter(|e| !dirs_only || e.file_type().is_ok_and(|t| t.is_dir()))
        .filter_map(|e| e.file_name().into_string().ok())
        .collect()
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
    let mut out = Names::default();
    let mut said = Vec::new();
    let pods: PathBuf = root.join("pods");
    match trusted(&pods) {
        Ok(true) => {
            for n in entries(&pods, true) {
                if let Some((uid, pod)) = parse_pod_dir(&n) {
                    out.pods.insert(uid, pod);
                }
            }
        }
        Ok(false) => {}
        Err(e) => said.push(e),
    }
    let containers = root.join("containers");
    match trusted(&containers) {
        Ok(true) => {
            for n in entries(&containers, false) {
                if let Some((id, name)) = parse_container_log(&n) {
                    out.containers.insert(id, name);
                }
            }
        }
        Ok(false) => {}
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

    fn tree(tag: &str) -> PathBuf {
        let root = std::env::temp_dir().join(format!("vramshim-kube-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
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
        let _ = std::fs::remove_dir_all(&root);
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
        let _ = std::fs::remove_dir_all(&root);
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
