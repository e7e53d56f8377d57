//! `<FLAG> engaged` banners: proof that a flag's feature actually ran.
//!
//! The field's lesson: flags were set, the server came up, and the feature
//! was silently off. So a banner is printed from the code path of the feature
//! itself, the first time it runs, and never from the place that reads the
//! flag. The daemon refuses to call a worker ready unless every truthy flag
//! shows its banner (on stdout or in `Info.banners_engaged`).

use std::io::Write;
use std::sync::Mutex;

/// The banners printed so far, and the test faults that tamper with them.
#[derive(Debug, Default)]
pub struct Banners {
    engaged: Mutex<Vec<String>>,
    /// Test fault: a flag whose banner is suppressed.
    skip: Option<String>,
}

impl Banners {
    /// A registry; `skip` names a flag whose banner is withheld (test
    /// fault `TTW_FAULT_SKIP_BANNER`).
    pub fn new(skip: Option<String>) -> Self {
        Self {
            engaged: Mutex::new(Vec::new()),
            skip,
        }
    }

    /// Records that `flag`'s feature ran; prints the banner the first time.
    pub fn engage(&self, flag: &str) {
        if self.skip.as_deref() == Some(flag) {
            return;
        }
        let mut engaged = self.engaged.lock().unwrap_or_else(|e| e.into_inner());
        if engaged.iter().any(|f| f == flag) {
            return;
        }
        engaged.push(flag.to_string());
        // Flush at once: the daemon scans stdout while we keep running.
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{}", tt_worker_contract::banner::line(flag));
        let _ = out.flush();
    }

    /// Flags engaged so far, in order.
    pub fn engaged(&self) -> Vec<String> {
        self.engaged
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_banner_is_recorded_once_and_skips_are_honoured() {
        let b = Banners::new(Some("TTW_KV_F16".into()));
        b.engage("TTW_MLP_DOWN_Q8");
        b.engage("TTW_MLP_DOWN_Q8");
        b.engage("TTW_KV_F16");
        assert_eq!(b.engaged(), vec!["TTW_MLP_DOWN_Q8".to_string()]);
    }
}
