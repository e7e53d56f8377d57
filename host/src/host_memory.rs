//! The host memory the engines share: 1 GiB hugepages (tt-metal pins its
//! host buffers there, `/dev/hugepages-1G`), RAM and `/dev/shm`. A model's
//! `hugepages_per_card` is what its engine needs (Tenstorrent's host setup
//! reserves 4 per card, `hugepages-setup.sh`; Llama-3.1-8B on a P150 needs
//! 12, tt-inference-server issue 4023); `check-config` and every start
//! refuse a config whose slots together need more than the host reserved,
//! or whose reservation leaves less RAM than `host.ram_floor_mib`, and
//! `/metrics` shows what is there.
//!
//! Read under the daemon's hardware roots (`hardware.sys_root` and
//! `proc_root`), so a fake root plays a host's numbers too.

use crate::cards::discovery::HardwareRoot;
use crate::config::Config;

/// Where the kernel counts 1 GiB hugepages, under the sys root.
const HUGEPAGES_1G: &str = "kernel/mm/hugepages/hugepages-1048576kB";

/// What the host has, where it could be read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HostMemory {
    /// 1 GiB hugepages reserved (`nr_hugepages`).
    pub hugepages_total: Option<u64>,
    /// Of them, not mapped by anyone (`free_hugepages`).
    pub hugepages_free: Option<u64>,
    /// `MemTotal`, bytes.
    pub mem_total_bytes: Option<u64>,
    /// `MemAvailable`, bytes.
    pub mem_available_bytes: Option<u64>,
}

impl HostMemory {
    /// Read under `hw`'s roots; a file that is not there is `None` (no 1 GiB
    /// hugepage support, or a fake root that plays none).
    pub fn read(hw: &HardwareRoot) -> HostMemory {
        let number = |name: &str| -> Option<u64> {
            std::fs::read_to_string(hw.sys_root.join(HUGEPAGES_1G).join(name))
                .ok()?
                .trim()
                .parse()
                .ok()
        };
        let meminfo = std::fs::read_to_string(hw.proc_root.join("meminfo")).unwrap_or_default();
        let kib = |field: &str| -> Option<u64> {
            meminfo
                .lines()
                .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
                .and_then(|rest| rest.split_whitespace().next()?.parse::<u64>().ok())
                .map(|k| k * 1024)
        };
        HostMemory {
            hugepages_total: number("nr_hugepages"),
            hugepages_free: number("free_hugepages"),
            mem_total_bytes: kib("MemTotal"),
            mem_available_bytes: kib("MemAvailable"),
        }
    }
}

/// The 1 GiB hugepages every configured slot's engine needs together:
/// `hugepages_per_card` for each card of each replica.
pub fn hugepages_needed(config: &Config) -> (u64, Vec<(String, u64)>) {
    let mut by_model = Vec::new();
    for (name, m) in &config.models {
        let cards: u64 = m.card_sets().iter().map(|s| s.len() as u64).sum();
        by_model.push((name.clone(), cards * u64::from(m.hugepages_per_card)));
    }
    (by_model.iter().map(|(_, n)| n).sum(), by_model)
}

/// Why the host cannot hold the configured slots' hugepages, if it cannot:
/// the numbers and the fix. None when it can or the host's count is not
/// known.
pub fn shortfall(config: &Config, host: &HostMemory) -> Option<String> {
    let total = host.hugepages_total?;
    let (needed, by_model) = hugepages_needed(config);
    if needed <= total {
        return None;
    }
    let parts: Vec<String> = by_model
        .iter()
        .filter(|(_, n)| *n > 0)
        .map(|(m, n)| format!("{m} {n}"))
        .collect();
    Some(format!(
        "the models need {needed} 1 GiB hugepages together ({}; hugepages_per_card for each card) but the host has {total} reserved (nr_hugepages); reserve more (services.tenstorrent-serving.hugepages.count, or hugepages=N on the kernel command line) or lower a model's hugepages_per_card (0 for an engine that pins none)",
        parts.join(", ")
    ))
}

/// Why the RAM the hugepages leave is below `host.ram_floor_mib`, if it
/// is: hugepages come out of RAM (MemTotal counts them), so what is left
/// for the engines' own processes and the system is MemTotal less the
/// reservation (what the slots need, or what the host reserved if more).
/// None when it is enough, the floor is 0, there are no models, or the
/// host's MemTotal is not known.
pub fn ram_shortfall(config: &Config, host: &HostMemory) -> Option<String> {
    let floor = config.host.ram_floor_mib * MIB;
    let total = host.mem_total_bytes?;
    if floor == 0 || config.models.is_empty() {
        return None;
    }
    let (needed, _) = hugepages_needed(config);
    let pages = needed.max(host.hugepages_total.unwrap_or(0));
    let left = total.saturating_sub(pages * GIB);
    if left >= floor {
        return None;
    }
    let reserved = if pages == 0 {
        String::new()
    } else {
        format!(
            " and {pages} GiB of it go to 1 GiB hugepages (the slots need {needed}, the host reserved {})",
            host.hugepages_total.unwrap_or(0)
        )
    };
    Some(format!(
        "the host has {} MiB of RAM{reserved}: {} MiB are left for the engines' own processes and the system, below host.ram_floor_mib ({} MiB); add RAM, reserve fewer hugepages (lower a model's hugepages_per_card or run fewer slots), or lower host.ram_floor_mib if the engines need less",
        total / MIB,
        left / MIB,
        config.host.ram_floor_mib
    ))
}

const MIB: u64 = 1024 * 1024;
const GIB: u64 = 1024 * MIB;

/// Every way the host falls short of the configured slots' memory, for a
/// start's refusal.
pub fn shortfalls(config: &Config, host: &HostMemory) -> Vec<String> {
    shortfall(config, host)
        .into_iter()
        .chain(ram_shortfall(config, host))
        .collect()
}

/// `check-config`'s problems: the first model that needs any is named.
pub fn check(config: &Config, hw: &HardwareRoot) -> Vec<crate::config::Problem> {
    let host = HostMemory::read(hw);
    let mut problems = Vec::new();
    if let Some(message) = shortfall(config, &host) {
        let key = config
            .models
            .iter()
            .find(|(_, m)| m.hugepages_per_card > 0)
            .map(|(name, _)| format!("models.{name}.hugepages_per_card"))
            .unwrap_or_else(|| "models".into());
        problems.push(crate::config::Problem { key, message });
    }
    if let Some(message) = ram_shortfall(config, &host) {
        problems.push(crate::config::Problem {
            key: "host.ram_floor_mib".into(),
            message,
        });
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_host_is_read_and_the_slots_needs_compared() {
        let dir = tempfile::tempdir().expect("dir");
        let hw = HardwareRoot {
            dev_root: dir.path().join("dev"),
            sys_root: dir.path().join("sys"),
            proc_root: dir.path().join("proc"),
        };
        assert_eq!(
            HostMemory::read(&hw),
            HostMemory::default(),
            "nothing there"
        );
        let pages = hw.sys_root.join(HUGEPAGES_1G);
        std::fs::create_dir_all(&pages).expect("dirs");
        std::fs::write(pages.join("nr_hugepages"), "6\n").expect("write");
        std::fs::write(pages.join("free_hugepages"), "5\n").expect("write");
        std::fs::create_dir_all(&hw.proc_root).expect("proc");
        std::fs::write(
            hw.proc_root.join("meminfo"),
            "MemTotal:       16000000 kB\nMemFree:  1 kB\nMemAvailable:    4000000 kB\n",
        )
        .expect("write");
        let host = HostMemory::read(&hw);
        assert_eq!(host.hugepages_total, Some(6));
        assert_eq!(host.hugepages_free, Some(5));
        assert_eq!(host.mem_available_bytes, Some(4_000_000 * 1024));

        let config = crate::config::parse(
            "[models.a]\ntp = 2\ncards = [0, 1]\ncheckpoint = \"/m\"\n[models.b]\ntp = 1\ncards = [2]\ncheckpoint = \"/m\"\nhugepages_per_card = 0\n",
        )
        .expect("config");
        assert_eq!(hugepages_needed(&config).0, 8);
        let why = shortfall(&config, &host).expect("short");
        assert!(
            why.contains("need 8") && why.contains("host has 6") && why.contains("a 8"),
            "{why}"
        );
        assert_eq!(
            shortfall(&config, &HostMemory::default()),
            None,
            "unknown host"
        );
    }

    #[test]
    fn the_ram_the_hugepages_leave_is_held_to_the_floor() {
        // The field's host: 15 GiB of RAM, 10 GiB of it in hugepages.
        let host = HostMemory {
            hugepages_total: Some(10),
            hugepages_free: Some(10),
            mem_total_bytes: Some(15 * GIB),
            mem_available_bytes: Some(4 * GIB),
        };
        let two_cards = "[models.a]\ntp = 2\ncards = [0, 1]\ncheckpoint = \"/m\"\n";
        let config = crate::config::parse(two_cards).expect("config");
        assert_eq!(ram_shortfall(&config, &host), None, "5 GiB left, floor 4");
        let config = crate::config::parse(&format!("[host]\nram_floor_mib = 6144\n{two_cards}"))
            .expect("config");
        let why = ram_shortfall(&config, &host).expect("below the floor");
        assert!(
            why.contains("15360 MiB of RAM and 10 GiB of it go to 1 GiB hugepages (the slots need 8, the host reserved 10): 5120 MiB are left")
                && why.contains("host.ram_floor_mib (6144 MiB)"),
            "{why}"
        );
        // The slots' need counts when the host has not reserved it yet.
        let config = crate::config::parse(&format!(
            "[host]\nram_floor_mib = 6144\n{two_cards}hugepages_per_card = 6\n"
        ))
        .expect("config");
        let small = HostMemory {
            hugepages_total: Some(0),
            ..host
        };
        let why = ram_shortfall(&config, &small).expect("12 of 15 GiB");
        assert!(why.contains("3072 MiB are left"), "{why}");
        assert_eq!(shortfalls(&config, &small).len(), 2, "hugepages and RAM");
        let off = crate::config::parse(&format!("[host]\nram_floor_mib = 0\n{two_cards}"))
            .expect("config");
        assert_eq!(ram_shortfall(&off, &small), None);
        assert_eq!(ram_shortfall(&config, &HostMemory::default()), None);
    }
}
