//! What `/proc` says about this host's cgroups: the cgroup mounts (`/proc/self/mountinfo`), the
//! cgroups this process is in (`/proc/self/cgroup`), and where those are below a mount.

use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;
use std::path::{Component, Path, PathBuf};

/// One line of `/proc/self/mountinfo`, the fields we use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct MountEntry {
    /// Root of the mount within its filesystem (for cgroupfs: the cgroup shown at the mount
    /// point).
    pub(crate) root: PathBuf,
    pub(crate) mount_point: PathBuf,
    pub(crate) fstype: String,
    pub(crate) super_options: Vec<String>,
}

pub(crate) fn parse_mountinfo(text: &str) -> Vec<MountEntry> {
    text.lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split(' ').collect();
            // id parent dev root mount-point options [optional...] - fstype source super-options
            let sep = fields.iter().skip(6).position(|f| *f == "-")? + 6;
            Some(MountEntry {
                root: unescape_mount_path(fields.get(3)?),
                mount_point: unescape_mount_path(fields.get(4)?),
                fstype: (*fields.get(sep + 1)?).to_owned(),
                super_options: fields
                    .get(sep + 3)
                    .map(|o| o.split(',').map(str::to_owned).collect())
                    .unwrap_or_default(),
            })
        })
        .collect()
}

/// Undoes the kernel's octal escaping of mountinfo paths (`\040` for a space, ...).
fn unescape_mount_path(s: &str) -> PathBuf {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' && i + 3 < bytes.len() {
            let digits = &bytes[i + 1..i + 4];
            if digits.iter().all(|d| (b'0'..=b'7').contains(d)) {
                let value = digits
                    .iter()
                    .fold(0u32, |acc, d| acc * 8 + u32::from(d - b'0'));
                if let Ok(byte) = u8::try_from(value) {
                    out.push(byte);
                    i += 4;
                    continue;
                }
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    PathBuf::from(OsString::from_vec(out))
}

/// One line of `/proc/self/cgroup`: `id:controllers:path`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct OwnCgroup {
    pub(super) id: String,
    /// Empty for the v2 line (`0::/path`); `name=systemd` style entries are kept verbatim.
    pub(super) controllers: Vec<String>,
    pub(super) path: String,
}

pub(super) fn parse_self_cgroup(text: &str) -> Vec<OwnCgroup> {
    text.lines()
        .filter_map(|line| {
            let mut parts = line.splitn(3, ':');
            let id = parts.next()?.to_owned();
            let controllers = parts
                .next()?
                .split(',')
                .filter(|c| !c.is_empty())
                .map(str::to_owned)
                .collect();
            let path = parts.next()?.trim_end_matches(" (deleted)").to_owned();
            Some(OwnCgroup {
                id,
                controllers,
                path,
            })
        })
        .collect()
}

/// The directory of cgroup `own_path` under a cgroupfs mounted at `mount_point` whose root is
/// `mount_root`. Falls back to the mount point when our cgroup is not visible below it (outside
/// the mount's root, or `/..` paths from a cgroup namespace).
pub(super) fn cgroup_dir(mount_point: &Path, mount_root: &Path, own_path: &str) -> PathBuf {
    let own = Path::new(own_path);
    if !own.is_absolute() || own.components().any(|c| c == Component::ParentDir) {
        return mount_point.to_path_buf();
    }
    match own.strip_prefix(mount_root) {
        Ok(rel) => mount_point.join(rel),
        Err(_) => mount_point.to_path_buf(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_parsing() {
        let text = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime shared:5 - cgroup cgroup rw,cpu
33 31 0:30 /docker/abc /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct
41 31 0:38 / /mnt/with\\040space rw,relatime - cgroup2 cgroup2 rw,nsdelegate
";
        let m = parse_mountinfo(text);
        assert_eq!(m.len(), 4);
        assert_eq!(m[1].fstype, "cgroup");
        assert_eq!(m[1].mount_point, PathBuf::from("/sys/fs/cgroup/cpu"));
        assert_eq!(m[1].super_options, vec!["rw", "cpu"]);
        assert_eq!(m[2].root, PathBuf::from("/docker/abc"));
        assert_eq!(m[2].super_options, vec!["rw", "cpu", "cpuacct"]);
        assert_eq!(m[3].mount_point, PathBuf::from("/mnt/with space"));
        assert_eq!(m[3].fstype, "cgroup2");
    }

    #[test]
    fn self_cgroup_parsing() {
        let text = "9:name=systemd:/\n4:memory:/process_api/c0dd\n2:cpu,cpuacct:/a:b\n0::/user.slice/x.scope\n";
        let own = parse_self_cgroup(text);
        assert_eq!(own.len(), 4);
        assert_eq!(own[1].controllers, vec!["memory"]);
        assert_eq!(own[1].path, "/process_api/c0dd");
        assert_eq!(own[2].controllers, vec!["cpu", "cpuacct"]);
        assert_eq!(own[2].path, "/a:b");
        assert_eq!(own[3].id, "0");
        assert!(own[3].controllers.is_empty());
        assert_eq!(own[3].path, "/user.slice/x.scope");
    }

    #[test]
    fn cgroup_dir_joins_relative_to_mount_root() {
        let mp = Path::new("/sys/fs/cgroup/memory");
        assert_eq!(cgroup_dir(mp, Path::new("/"), "/"), mp);
        assert_eq!(
            cgroup_dir(mp, Path::new("/"), "/process_api/x"),
            mp.join("process_api/x")
        );
        assert_eq!(
            cgroup_dir(mp, Path::new("/docker/abc"), "/docker/abc/inner"),
            mp.join("inner")
        );
        assert_eq!(cgroup_dir(mp, Path::new("/docker/abc"), "/other"), mp);
        assert_eq!(cgroup_dir(mp, Path::new("/"), "/../.."), mp);
    }
}
