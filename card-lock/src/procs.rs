//! Everything tt-serving reads from the host's `/proc`, in one module, through
//! the `procfs` crate: one process's facts, the process table and trees,
//! environments, memory, open files, file locks, groups, cgroups and mounts,
//! and the host's counters.
//!
//! Processes are real even on a fake hardware root (workers, ttctl jobs,
//! anything holding a card), so this always reads the real `/proc`. The
//! configured `proc_root` holds only what tt-kmd adds under
//! `/proc/driver/tenstorrent/` (read by the daemon's card discovery: a
//! driver file, not a procfs one).
//!
//! Every reader tolerates a process that vanishes between two reads, or
//! that belongs to another user: what cannot be read is `None`, empty, or
//! left out.
//!
//! Two things `procfs` 0.18 does not do, done here: the octal escapes of
//! mount paths (`\040` for a space) are undone, and a blocked lock waiter's
//! `->` marker is not kept, so the holder is the first matching line (the
//! kernel prints the holder before its waiters, fs/locks.c `locks_show`).

use procfs::process::{FDTarget, MMapPath, Process};
use procfs::Current;

/// Why a `/proc` file could not be read.
pub use procfs::ProcError;
use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsStr;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// One process as `/proc/<pid>/stat` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Proc {
    /// Process id.
    pub pid: u32,
    /// Parent's process id.
    pub ppid: u32,
    /// State letter (`R`, `S`, `D`, `Z`, ...).
    pub state: char,
    /// Start time in clock ticks after boot: with the pid, it names one
    /// process even after the pid is reused.
    pub start: u64,
    /// The command name (`comm`, at most 15 bytes).
    pub comm: String,
}

impl Proc {
    /// Whether it has exited and waits for its parent to reap it.
    pub fn is_zombie(&self) -> bool {
        matches!(self.state, 'Z' | 'X')
    }

    /// `pid 123 (sleep)`, for logs and reasons.
    pub fn words(&self) -> String {
        format!("pid {} ({})", self.pid, self.comm)
    }
}

fn process(pid: u32) -> Option<Process> {
    Process::new(i32::try_from(pid).ok()?).ok()
}

fn from_stat(stat: &procfs::process::Stat) -> Option<Proc> {
    Some(Proc {
        pid: u32::try_from(stat.pid).ok()?,
        ppid: u32::try_from(stat.ppid).ok()?,
        state: stat.state,
        start: stat.starttime,
        comm: stat.comm.clone(),
    })
}

/// One process, or None when it is gone or unreadable.
pub fn stat(pid: u32) -> Option<Proc> {
    from_stat(&process(pid)?.stat().ok()?)
}

/// Whether a process with this pid exists (a zombie counts).
pub fn exists(pid: u32) -> bool {
    process(pid).is_some()
}

/// Every process that could be read.
pub fn all() -> Vec<Proc> {
    let Ok(table) = procfs::process::all_processes() else {
        return Vec::new();
    };
    table
        .flatten()
        .filter_map(|p| from_stat(&p.stat().ok()?))
        .collect()
}

/// The descendants of `roots` (not the roots themselves) in `table`, by
/// parent links: children, their children, and so on.
pub fn descendants(table: &[Proc], roots: &BTreeSet<u32>) -> BTreeSet<u32> {
    let mut children: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
    for p in table {
        children.entry(p.ppid).or_default().push(p.pid);
    }
    let mut found = BTreeSet::new();
    let mut todo: Vec<u32> = roots.iter().copied().collect();
    while let Some(pid) = todo.pop() {
        for &child in children.get(&pid).map(Vec::as_slice).unwrap_or(&[]) {
            if !roots.contains(&child) && found.insert(child) {
                todo.push(child);
            }
        }
    }
    found
}

/// `pid` and everything below it, read now.
pub fn tree(pid: u32) -> Vec<u32> {
    let mut found: Vec<u32> = descendants(&all(), &BTreeSet::from([pid]))
        .into_iter()
        .collect();
    found.insert(0, pid);
    found
}

/// Whether `pid` is `ancestor` or below it, by walking parent links (at
/// most 64 of them: a loop cannot hang the caller).
pub fn is_self_or_below(pid: u32, ancestor: u32) -> bool {
    let mut current = pid;
    for _ in 0..64 {
        if current == ancestor {
            return true;
        }
        if current <= 1 {
            return false;
        }
        match stat(current) {
            Some(p) => current = p.ppid,
            None => return false,
        }
    }
    false
}

/// The value of `name` in the process's initial environment; None when it
/// has none or it cannot be read (gone, a zombie, another user's process).
pub fn env_var(pid: u32, name: &str) -> Option<Vec<u8>> {
    use std::os::unix::ffi::OsStrExt;
    let env = process(pid)?.environ().ok()?;
    env.get(OsStr::new(name)).map(|v| v.as_bytes().to_vec())
}

/// Resident set size of a process in bytes (0 when unreadable).
pub fn rss_bytes(pid: u32) -> u64 {
    process(pid)
        .and_then(|p| p.statm().ok())
        .map_or(0, |m| m.resident * procfs::page_size())
}

/// How many file descriptors the process has open (None when unreadable).
pub fn open_fds(pid: u32) -> Option<usize> {
    process(pid)?.fd_count().ok()
}

/// The process's command line, one word per argument (empty when it cannot
/// be read, or for a kernel thread).
pub fn cmdline(pid: u32) -> Vec<String> {
    process(pid)
        .and_then(|p| p.cmdline().ok())
        .unwrap_or_default()
}

/// The user owning the process (by name, else `uid N`) and its command
/// line cut to 120 characters so status lines stay readable; empty strings
/// for what cannot be read.
pub fn identity(pid: u32) -> (String, String) {
    let user = process(pid)
        .and_then(|p| p.status().ok())
        .map(|s| {
            nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(s.ruid))
                .ok()
                .flatten()
                .map(|u| u.name)
                .unwrap_or_else(|| format!("uid {}", s.ruid))
        })
        .unwrap_or_default();
    let line = cmdline(pid).join(" ");
    let command = if line.chars().count() > 120 {
        format!("{}…", line.chars().take(119).collect::<String>())
    } else {
        line
    };
    (user, command)
}

/// Who a process acts as: its effective user and group, and its
/// supplementary groups (`/proc/<pid>/status`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ids {
    /// Effective user id.
    pub uid: u32,
    /// Effective group id.
    pub gid: u32,
    /// Supplementary groups.
    pub groups: Vec<u32>,
}

/// The process's [`Ids`], or None when it is gone or unreadable.
pub fn ids(pid: u32) -> Option<Ids> {
    let status = process(pid)?.status().ok()?;
    Some(Ids {
        uid: status.euid,
        gid: status.egid,
        groups: status.groups,
    })
}

/// The process's supplementary groups, as the kernel lists them in
/// `/proc/<pid>/status`.
pub fn groups(pid: u32) -> Option<Vec<u32>> {
    Some(process(pid)?.status().ok()?.groups)
}

/// Whether the process has the file with this device and inode open.
pub fn has_open(pid: u32, dev: u64, ino: u64) -> bool {
    let Some(p) = process(pid) else {
        return false;
    };
    let Ok(fds) = p.fd() else {
        return false;
    };
    fds.flatten()
        .filter(|fd| matches!(fd.target, FDTarget::Path(_)))
        .any(|fd| {
            // The link's target names the file; its metadata proves it is
            // the same one (a path may have been replaced since).
            let link = Path::new("/proc")
                .join(pid.to_string())
                .join("fd")
                .join(fd.fd.to_string());
            std::fs::metadata(link).is_ok_and(|m| m.dev() == dev && m.ino() == ino)
        })
}

/// Every other process with the file open, in pid order.
pub fn with_open(dev: u64, ino: u64) -> Vec<u32> {
    let me = std::process::id();
    let mut pids: Vec<u32> = all()
        .into_iter()
        .map(|p| p.pid)
        .filter(|pid| *pid != me && has_open(*pid, dev, ino))
        .collect();
    pids.sort_unstable();
    pids
}

/// The pid that holds a flock on the file with this device and inode, from
/// `/proc/locks`.
pub fn flock_holder(dev: u64, ino: u64) -> Option<u32> {
    let (major, minor) = (libc::major(dev), libc::minor(dev));
    procfs::locks().ok()?.into_iter().find_map(|lock| {
        (matches!(lock.lock_type, procfs::LockType::FLock)
            && lock.inode == ino
            && lock.devmaj == major
            && lock.devmin == minor)
            .then_some(lock.pid)
            .flatten()
            .and_then(|pid| u32::try_from(pid).ok())
    })
}

/// A file as `/proc/<pid>/maps` names it: its device and inode, and the
/// path we reach it by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MappedFile {
    /// `st_dev` of the file.
    pub dev: u64,
    /// `st_ino` of the file.
    pub ino: u64,
    /// Its path as this process sees it.
    pub path: PathBuf,
}

impl MappedFile {
    /// The file at `path` now (not following a link there).
    pub fn at(path: &Path) -> Option<MappedFile> {
        let meta = std::fs::symlink_metadata(path).ok()?;
        Some(MappedFile {
            dev: meta.dev(),
            ino: meta.ino(),
            path: path.to_path_buf(),
        })
    }
}

/// Whether the process has the file mapped (`/proc/<pid>/maps`). Matched
/// by device and inode: a process in another mount namespace sees the file
/// under another path (a directory bound over its `/dev/shm`) and its maps
/// print that path. The path matches too, for a filesystem whose maps show
/// another device (overlayfs shows the layer's).
pub fn maps(pid: u32, file: &MappedFile) -> bool {
    let Some(maps) = process(pid).and_then(|p| p.maps().ok()) else {
        return false;
    };
    let (major, minor) = (libc::major(file.dev), libc::minor(file.dev));
    maps.into_iter().any(|m| {
        let same_inode = m.inode == file.ino
            && u32::try_from(m.dev.0).is_ok_and(|d| d == major)
            && u32::try_from(m.dev.1).is_ok_and(|d| d == minor);
        same_inode || matches!(&m.pathname, MMapPath::Path(p) if p == &file.path)
    })
}

/// Every process that has the file mapped, in pid order.
pub fn mapping(file: &MappedFile) -> Vec<u32> {
    let mut pids: Vec<u32> = all()
        .into_iter()
        .map(|p| p.pid)
        .filter(|pid| maps(*pid, file))
        .collect();
    pids.sort_unstable();
    pids
}

/// The first other process that has the file open or mapped (a live user
/// of it), if any.
pub fn user_of(file: &MappedFile) -> Option<u32> {
    let me = std::process::id();
    all()
        .into_iter()
        .filter(|p| p.pid != me && !p.is_zombie())
        .map(|p| p.pid)
        .find(|pid| maps(*pid, file) || has_open(*pid, file.dev, file.ino))
}

/// The process (thread group) a thread belongs to: `Tgid` of
/// `/proc/<tid>/status` (a thread's directory is there, unlisted). None
/// when no such thread lives in this pid namespace.
pub fn thread_group(tid: u32) -> Option<u32> {
    u32::try_from(process(tid)?.status().ok()?.tgid).ok()
}

/// This process's cgroup v2 path (the `0::` line of `/proc/self/cgroup`);
/// None on a host with cgroup v1 only.
pub fn own_cgroup_v2() -> Result<Option<String>, procfs::ProcError> {
    Ok(v2_path(Process::myself()?.cgroups()?))
}

fn v2_path(groups: procfs::ProcessCGroups) -> Option<String> {
    groups
        .0
        .into_iter()
        .find(|g| g.hierarchy == 0 && g.controllers.is_empty())
        .map(|g| g.pathname)
}

/// The mount point and root of the first `cgroup2` mount this process sees
/// (`/proc/self/mountinfo`).
pub fn cgroup2_mount() -> Result<Option<(PathBuf, String)>, procfs::ProcError> {
    Ok(first_cgroup2(Process::myself()?.mountinfo()?))
}

fn first_cgroup2(mounts: procfs::process::MountInfos) -> Option<(PathBuf, String)> {
    mounts
        .into_iter()
        .find(|m| m.fs_type == "cgroup2")
        .map(|m| {
            (
                PathBuf::from(unescape_mount(&m.mount_point.to_string_lossy())),
                unescape_mount(&m.root),
            )
        })
}

/// mountinfo writes spaces, tabs, newlines and backslashes as octal
/// (`\040`); procfs passes them through.
pub fn unescape_mount(field: &str) -> String {
    let mut out = Vec::new();
    let bytes = field.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes
            .get(i + 1..i + 4)
            .and_then(|d| std::str::from_utf8(d).ok())
            .and_then(|d| u8::from_str_radix(d, 8).ok());
        match (bytes[i], octal) {
            (b'\\', Some(b)) => {
                out.push(b);
                i += 4;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The kernel's count of OOM kills since boot (`/proc/vmstat` `oom_kill`,
/// Linux 4.13 and later); None when it cannot be read.
pub fn host_oom_kills() -> Option<u64> {
    let counters = procfs::vmstat().ok()?;
    u64::try_from(*counters.get("oom_kill")?).ok()
}

/// utime + stime of a process (its reaped threads included), in clock
/// ticks; 0 when it cannot be read.
pub fn cpu_ticks(pid: u32) -> u64 {
    process(pid)
        .and_then(|p| p.stat().ok())
        .map_or(0, |s| s.utime + s.stime)
}

/// Clock ticks per second (`sysconf(_SC_CLK_TCK)`).
pub fn ticks_per_second() -> u64 {
    procfs::ticks_per_second()
}

/// CPU time the scheduler measured for a process's live threads, in
/// nanoseconds (`/proc/<pid>/task/*/schedstat`, first field); 0 when it
/// cannot be read. Threads that exit between two readings take their time
/// with them.
pub fn cpu_ns(pid: u32) -> u64 {
    let Some(tasks) = process(pid).and_then(|p| p.tasks().ok()) else {
        return 0;
    };
    tasks
        .flatten()
        .filter_map(|t| t.schedstat().ok())
        .map(|s| s.sum_exec_runtime)
        .sum()
}

/// The host's 1, 5 and 15 minute load averages (`/proc/loadavg`); empty
/// when it cannot be read.
pub fn loadavg() -> Vec<f64> {
    procfs::LoadAverage::current()
        // The kernel prints two decimals; f32 to f64 would add digits.
        .map(|l| {
            [l.one, l.five, l.fifteen]
                .map(|v| (f64::from(v) * 100.0).round() / 100.0)
                .to_vec()
        })
        .unwrap_or_default()
}

/// The host's CPU model name (`/proc/cpuinfo`'s first `model name`), for
/// benchmark records.
pub fn cpu_model() -> Option<String> {
    procfs::CpuInfo::current()
        .ok()?
        .model_name(0)
        .map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::{Command, Stdio};

    #[test]
    fn descendants_follow_parent_links_but_not_siblings() {
        let p = |pid, ppid| Proc {
            pid,
            ppid,
            state: 'S',
            start: 1,
            comm: String::new(),
        };
        let table = [p(1, 0), p(10, 1), p(11, 10), p(12, 11), p(20, 1), p(13, 10)];
        let found = descendants(&table, &BTreeSet::from([10]));
        assert_eq!(found, BTreeSet::from([11, 12, 13]));
    }

    #[test]
    fn this_process_is_readable_with_its_environment_memory_and_cpu() {
        let me = stat(std::process::id()).unwrap();
        assert!(!me.is_zombie());
        assert!(all().iter().any(|p| p.pid == me.pid));
        assert!(rss_bytes(me.pid) > 0);
        // Every test process has PATH (cargo sets it).
        assert!(env_var(me.pid, "PATH").is_some());
        assert_eq!(env_var(me.pid, "NO_SUCH_VARIABLE_HERE"), None);
        assert!(cpu_ns(me.pid) > 0);
        assert!(!cmdline(me.pid).is_empty());
        assert!(groups(me.pid).is_some());
        assert_eq!(loadavg().len(), 3);
        assert!(cpu_model().is_some_and(|m| !m.is_empty()));
    }

    #[test]
    fn a_child_is_below_us_with_its_command_and_a_gone_pid_reads_as_nothing() {
        let mut child = Command::new("sleep")
            .arg("30")
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        let pid = child.id();
        let me = std::process::id();
        // Until its exec is through, the child's command line is its
        // parent's or empty (CI once read [] with comm already "sleep").
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while cmdline(pid) != ["sleep", "30"] && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let seen = stat(pid).unwrap();
        assert_eq!((seen.ppid, seen.comm.as_str()), (me, "sleep"));
        assert!(is_self_or_below(pid, me));
        assert!(!is_self_or_below(me, pid));
        assert!(tree(me).contains(&pid));
        assert_eq!(cmdline(pid), ["sleep", "30"]);
        assert_eq!(identity(pid).1, "sleep 30");
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(stat(pid).is_none() && !exists(pid));
        assert_eq!((rss_bytes(pid), cpu_ticks(pid)), (0, 0));
        assert!(cmdline(pid).is_empty() && env_var(pid, "PATH").is_none());
    }

    #[test]
    fn a_flock_names_its_holder_and_the_processes_with_the_file_open() {
        use fs2::FileExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("held");
        std::fs::write(&path, "").unwrap();
        let meta = std::fs::metadata(&path).unwrap();
        let me = std::process::id();
        assert_eq!(flock_holder(meta.dev(), meta.ino()), None);
        assert!(!has_open(me, meta.dev(), meta.ino()));
        let file = std::fs::File::open(&path).unwrap();
        file.try_lock_exclusive().unwrap();
        assert_eq!(flock_holder(meta.dev(), meta.ino()), Some(me));
        assert!(has_open(me, meta.dev(), meta.ino()));
        // Another process with the file open (and nothing else).
        let mut child = Command::new("sh")
            .args(["-c", "exec 9<\"$0\" && exec sleep 30"])
            .arg(&path)
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !with_open(meta.dev(), meta.ino()).contains(&child.id()) {
            assert!(
                std::time::Instant::now() < deadline,
                "the child never opened the file"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        // with_open leaves the caller out, and so does user_of.
        assert_eq!(with_open(meta.dev(), meta.ino()), [child.id()]);
        let file = MappedFile::at(&path).unwrap();
        assert_eq!(user_of(&file), Some(child.id()));
        assert!(!maps(child.id(), &file) && mapping(&file).is_empty());
        child.kill().unwrap();
        child.wait().unwrap();
    }

    #[test]
    fn the_v2_line_and_the_cgroup2_mount_are_picked_out() {
        use procfs::FromBufRead;
        let own = "9:name=systemd:/\n4:memory:/x\n0::/system.slice/tt.service\n";
        let groups = procfs::ProcessCGroups::from_buf_read(own.as_bytes()).unwrap();
        assert_eq!(v2_path(groups).as_deref(), Some("/system.slice/tt.service"));
        let v1 = procfs::ProcessCGroups::from_buf_read("4:memory:/x\n".as_bytes()).unwrap();
        assert_eq!(v2_path(v1), None);
        let mountinfo =
            "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n\
                         41 31 0:38 /sub /mnt/cg\\040two rw,relatime - cgroup2 cgroup2 rw\n";
        let mounts = procfs::process::MountInfos::from_buf_read(mountinfo.as_bytes()).unwrap();
        assert_eq!(
            first_cgroup2(mounts),
            Some((PathBuf::from("/mnt/cg two"), "/sub".to_string()))
        );
        // This host's own answers parse (whatever they are).
        assert!(own_cgroup_v2().is_ok() && cgroup2_mount().is_ok());
    }

    #[test]
    fn mount_paths_lose_their_octal_escapes() {
        assert_eq!(unescape_mount(r"/sys/fs/my\040cgroup"), "/sys/fs/my cgroup");
        assert_eq!(unescape_mount(r"/a\134b"), r"/a\b");
        assert_eq!(unescape_mount(r"/plain\9"), r"/plain\9");
    }
}
