//! Reading processes from the real `/proc` (workers are real processes even
//! on a fake hardware root): one process's facts, the whole table, a
//! process tree, resident memory, and whether a process carries an
//! environment entry. Everything here tolerates processes that vanish
//! between two reads: a process that cannot be read is left out.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

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

/// Parse the text of `/proc/<pid>/stat`. The command name is in
/// parentheses and may itself hold spaces and parentheses, so the fields
/// after it are read from the last `)`.
pub fn parse_stat(pid: u32, text: &str) -> Option<Proc> {
    let open = text.find('(')?;
    let close = text.rfind(')')?;
    let comm = text.get(open + 1..close)?.to_string();
    let rest: Vec<&str> = text.get(close + 1..)?.split_whitespace().collect();
    // rest[0] is field 3 (state), rest[1] field 4 (ppid), rest[19] field 22
    // (starttime).
    Some(Proc {
        pid,
        state: rest.first()?.chars().next()?,
        ppid: rest.get(1)?.parse().ok()?,
        start: rest.get(19)?.parse().ok()?,
        comm,
    })
}

/// One process, or None when it is gone or unreadable.
pub fn stat(pid: u32) -> Option<Proc> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_stat(pid, &text)
}

/// Every process that could be read.
pub fn all() -> Vec<Proc> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(stat)
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

/// Whether the process's initial environment holds exactly `entry`
/// (`KEY=VALUE`), or an entry starting with `entry` when `prefix`. False
/// when it cannot be read (gone, a zombie, another user's process).
pub fn has_env(pid: u32, entry: &[u8], prefix: bool) -> bool {
    let Ok(env) = std::fs::read(Path::new("/proc").join(pid.to_string()).join("environ")) else {
        return false;
    };
    env.split(|b| *b == 0).any(|e| {
        if prefix {
            e.starts_with(entry)
        } else {
            e == entry
        }
    })
}

/// Resident set size of a process in bytes (0 when unreadable).
pub fn rss_bytes(pid: u32) -> u64 {
    let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/statm")) else {
        return 0;
    };
    let pages: u64 = text
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    pages * page_size()
}

fn page_size() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(page).unwrap_or(4096)
}

/// The kernel's count of OOM kills since boot (`/proc/vmstat` `oom_kill`,
/// Linux 4.13 and later); None when it cannot be read.
pub fn host_oom_kills() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/vmstat").ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("oom_kill "))
        .and_then(|v| v.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_is_read_past_a_command_name_with_spaces_and_parentheses() {
        let text = "4242 (tt (worker) x) S 812 4242 4242 0 -1 4194560 1 0 0 0 0 0 0 0 20 0 3 0 987654 1000 10 18446744073709551615";
        let p = parse_stat(4242, text).unwrap();
        assert_eq!(p.comm, "tt (worker) x");
        assert_eq!(p.state, 'S');
        assert_eq!(p.ppid, 812);
        assert_eq!(p.start, 987654);
        assert!(parse_stat(1, "1 (init").is_none());
    }

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
    fn this_process_is_readable_and_has_its_environment() {
        let me = stat(std::process::id()).unwrap();
        assert!(!me.is_zombie());
        assert!(all().iter().any(|p| p.pid == me.pid));
        assert!(rss_bytes(me.pid) > 0);
        // Every test process has PATH (cargo sets it).
        assert!(has_env(me.pid, b"PATH=", true));
        assert!(!has_env(me.pid, b"NO_SUCH_VARIABLE_HERE=", true));
    }
}
