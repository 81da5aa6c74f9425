//! Finding the host's cgroup layout from `/proc/self/mountinfo`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::{CgroupError, CgroupLayout};

/// Controllers a sandbox needs limits from; each must be available.
const REQUIRED: [&str; 3] = ["memory", "cpu", "pids"];
/// Controllers used only for accounting; recorded when mounted.
const OPTIONAL: [&str; 1] = ["cpuacct"];

impl CgroupLayout {
    /// Reads `/proc/self/mountinfo` and probes the real filesystem.
    pub fn discover() -> Result<CgroupLayout, CgroupError> {
        Self::discover_from(Path::new("/proc/self/mountinfo"))
    }

    /// Like [`CgroupLayout::discover`], with the mount table at `mountinfo`.
    pub fn discover_from(mountinfo: &Path) -> Result<CgroupLayout, CgroupError> {
        let text =
            std::fs::read_to_string(mountinfo).map_err(|source| CgroupError::ReadMountinfo {
                path: mountinfo.to_owned(),
                source,
            })?;
        Self::from_mountinfo(&text, &|p: &Path| std::fs::read_to_string(p).ok())
    }

    /// Decides the layout from the text of a mountinfo file.
    ///
    /// `read` returns a file's content, or `None` when it cannot be read; it is
    /// used to see whether v1 swap accounting is on and which controllers a
    /// cgroup2 root offers, neither of which the mount table shows.
    ///
    /// A host whose v1 hierarchies carry memory, cpu or pids is hybrid and is
    /// driven through v1, even when a cgroup2 tree is mounted too (its
    /// controllers are then bound to v1 and it has none of them). A mix, with
    /// some of those controllers on v1 and the rest nowhere, is refused rather
    /// than run with a limit missing.
    pub fn from_mountinfo(
        text: &str,
        read: &dyn Fn(&Path) -> Option<String>,
    ) -> Result<CgroupLayout, CgroupError> {
        let mut v1: BTreeMap<String, PathBuf> = BTreeMap::new();
        let mut v2: Vec<PathBuf> = Vec::new();
        for mount in text.lines().filter_map(parse_line) {
            match mount.fstype {
                "cgroup" => {
                    for opt in mount.super_options.split(',') {
                        if REQUIRED.contains(&opt) || OPTIONAL.contains(&opt) {
                            v1.entry(opt.to_owned())
                                .or_insert_with(|| mount.mountpoint.clone());
                        }
                    }
                }
                "cgroup2" => v2.push(mount.mountpoint),
                _ => {}
            }
        }

        if REQUIRED.iter().any(|c| v1.contains_key(*c)) {
            if let Some(missing) = REQUIRED.iter().find(|c| !v1.contains_key(**c)) {
                return Err(CgroupError::MissingV1Controller {
                    controller: missing,
                });
            }
            let memsw = v1["memory"].join("memory.memsw.limit_in_bytes");
            return Ok(CgroupLayout::V1 {
                swap_accounting: read(&memsw).is_some(),
                controllers: v1,
            });
        }

        // Prefer the conventional mountpoint when cgroup2 is mounted twice.
        let root = v2
            .iter()
            .find(|p| p.as_path() == Path::new("/sys/fs/cgroup"))
            .or_else(|| v2.first())
            .ok_or(CgroupError::NoCgroupMount)?
            .clone();
        let offered = read(&root.join("cgroup.controllers")).unwrap_or_default();
        let missing: Vec<String> = REQUIRED
            .iter()
            .filter(|c| !offered.split_whitespace().any(|o| o == **c))
            .map(|c| c.to_string())
            .collect();
        if !missing.is_empty() {
            return Err(CgroupError::MissingV2Controllers { root, missing });
        }
        Ok(CgroupLayout::V2 { root })
    }
}

struct Mount<'a> {
    mountpoint: PathBuf,
    fstype: &'a str,
    super_options: &'a str,
}

/// Parses one mountinfo line (see proc(5)):
/// `id parent maj:min root mountpoint options [optional...] - fstype source super_options`.
fn parse_line(line: &str) -> Option<Mount<'_>> {
    let (left, right) = line.split_once(" - ")?;
    let mountpoint = left.split(' ').nth(4)?;
    let mut right = right.split(' ');
    let fstype = right.next()?;
    let _source = right.next()?;
    let super_options = right.next().unwrap_or("");
    Some(Mount {
        mountpoint: PathBuf::from(unescape(mountpoint)),
        fstype,
        super_options,
    })
}

/// Undoes mountinfo's octal escapes (`\040` for a space, and so on).
fn unescape(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes
            .get(i + 1..i + 4)
            .filter(|d| bytes[i] == b'\\' && d.iter().all(|b| (b'0'..=b'7').contains(b)));
        match octal {
            Some(d) => {
                let v = d.iter().fold(0u32, |acc, b| acc * 8 + u32::from(b - b'0'));
                out.push(v as u8);
                i += 4;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The mount table of the development hosts, trimmed to the cgroup lines.
    const HYBRID: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
34 31 0:31 / /sys/fs/cgroup/cpuset rw,relatime - cgroup cgroup rw,cpuset
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";

    const PURE_V2: &str = "\
22 1 0:21 / /proc rw,nosuid,nodev,noexec,relatime shared:12 - proc proc rw
30 24 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot
";

    fn files(
        existing: &'static [(&'static str, &'static str)],
    ) -> impl Fn(&Path) -> Option<String> {
        move |p: &Path| {
            existing
                .iter()
                .find(|(path, _)| Path::new(path) == p)
                .map(|(_, content)| content.to_string())
        }
    }

    fn v1(pairs: &[(&str, &str)], swap_accounting: bool) -> CgroupLayout {
        CgroupLayout::V1 {
            controllers: pairs
                .iter()
                .map(|(c, p)| (c.to_string(), PathBuf::from(p)))
                .collect(),
            swap_accounting,
        }
    }

    #[test]
    fn hybrid_host_with_an_empty_unified_tree_is_driven_through_v1() {
        let read = files(&[(
            "/sys/fs/cgroup/memory/memory.memsw.limit_in_bytes",
            "9223372036854771712\n",
        )]);
        let layout = CgroupLayout::from_mountinfo(HYBRID, &read).unwrap();
        let expected = v1(
            &[
                ("cpu", "/sys/fs/cgroup/cpu"),
                ("cpuacct", "/sys/fs/cgroup/cpuacct"),
                ("memory", "/sys/fs/cgroup/memory"),
                ("pids", "/sys/fs/cgroup/pids"),
            ],
            true,
        );
        assert_eq!(layout, expected);
    }

    #[test]
    fn v1_without_memsw_files_reports_swap_accounting_off() {
        let layout = CgroupLayout::from_mountinfo(HYBRID, &files(&[])).unwrap();
        assert!(matches!(
            layout,
            CgroupLayout::V1 {
                swap_accounting: false,
                ..
            }
        ));
    }

    #[test]
    fn comounted_cpu_and_cpuacct_share_one_mountpoint() {
        let text = "\
1 0 0:1 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct
2 0 0:2 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory
3 0 0:3 / /sys/fs/cgroup/pids rw - cgroup cgroup rw,pids
";
        let layout = CgroupLayout::from_mountinfo(text, &files(&[])).unwrap();
        let expected = v1(
            &[
                ("cpu", "/sys/fs/cgroup/cpu,cpuacct"),
                ("cpuacct", "/sys/fs/cgroup/cpu,cpuacct"),
                ("memory", "/sys/fs/cgroup/memory"),
                ("pids", "/sys/fs/cgroup/pids"),
            ],
            false,
        );
        assert_eq!(layout, expected);
    }

    #[test]
    fn pure_v2_host_with_the_controllers_is_v2() {
        let read = files(&[(
            "/sys/fs/cgroup/cgroup.controllers",
            "cpuset cpu io memory hugetlb pids rdma misc\n",
        )]);
        let layout = CgroupLayout::from_mountinfo(PURE_V2, &read).unwrap();
        assert_eq!(
            layout,
            CgroupLayout::V2 {
                root: "/sys/fs/cgroup".into()
            }
        );
    }

    #[test]
    fn v2_root_lacking_a_controller_is_refused_with_the_controller_named() {
        let read = files(&[("/sys/fs/cgroup/cgroup.controllers", "cpu memory\n")]);
        let err = CgroupLayout::from_mountinfo(PURE_V2, &read).unwrap_err();
        assert!(
            matches!(&err, CgroupError::MissingV2Controllers { missing, .. } if missing == &["pids"]),
            "{err:?}"
        );
    }

    #[test]
    fn v1_with_a_required_controller_missing_is_refused() {
        let text = "2 0 0:2 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n";
        let err = CgroupLayout::from_mountinfo(text, &files(&[])).unwrap_err();
        assert!(
            matches!(err, CgroupError::MissingV1Controller { controller: "cpu" }),
            "{err:?}"
        );
    }

    #[test]
    fn no_cgroup_mount_is_refused() {
        let text = "22 1 0:21 / /proc rw - proc proc rw\n";
        let err = CgroupLayout::from_mountinfo(text, &files(&[])).unwrap_err();
        assert!(matches!(err, CgroupError::NoCgroupMount), "{err:?}");
    }

    #[test]
    fn escaped_mountpoints_are_unescaped() {
        let text = "30 24 0:26 / /run/my\\040cgroup rw - cgroup2 cgroup2 rw\n";
        let read = files(&[("/run/my cgroup/cgroup.controllers", "memory cpu pids")]);
        let layout = CgroupLayout::from_mountinfo(text, &read).unwrap();
        assert_eq!(
            layout,
            CgroupLayout::V2 {
                root: "/run/my cgroup".into()
            }
        );
    }

    #[test]
    fn this_host_is_discovered_as_a_layout() {
        // Whatever the host is, discovery must succeed: sandboxes cannot be
        // limited otherwise.
        CgroupLayout::discover().unwrap();
    }
}
