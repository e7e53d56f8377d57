//! Who may do what on the control socket.
//!
//! The socket's mode and group (`daemon.control_socket_mode`,
//! `daemon.control_socket_group`) decide who can connect at all; everyone
//! who can connect may use the read-only operations. Destructive operations
//! additionally need root or membership in `daemon.control_admin_group`,
//! checked against the kernel's credentials of the connecting process
//! (SO_PEERCRED), which a client cannot forge. The credentials are read once
//! per connection, at accept time, and reach each handler as a [`Peer`] in
//! the request's extensions.

use nix::unistd::{Gid, Group, Uid, User};
use tonic::{Request, Status};

/// The process at the other end of a control connection, as the kernel
/// reported it when the connection was made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peer {
    /// Effective uid.
    pub uid: u32,
    /// Effective (primary) gid.
    pub gid: u32,
    /// Pid, when the peer is visible in our pid namespace.
    pub pid: Option<i32>,
    /// Supplementary groups.
    pub groups: Vec<u32>,
}

/// What is known about a control connection's peer: None when the kernel
/// would not say (the connection is then refused destructive operations).
pub type PeerInfo = Option<Peer>;

impl Peer {
    /// The peer of an accepted control connection. Supplementary groups come
    /// from `/proc/<pid>/status` (the kernel's own list for that process);
    /// when it cannot be read, from the group database for the user.
    pub fn of(stream: &tokio::net::UnixStream) -> PeerInfo {
        let cred = match stream.peer_cred() {
            Ok(cred) => cred,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read a control connection's peer credentials (SO_PEERCRED); it may use read-only operations only");
                return None;
            }
        };
        // Pid 0: the peer lives in a pid namespace we cannot see into.
        let pid = cred.pid().filter(|p| *p > 0);
        let groups = pid
            .and_then(|p| u32::try_from(p).ok())
            .and_then(tt_card_lock::procs::groups)
            .unwrap_or_else(|| groups_from_database(cred.uid(), cred.gid()));
        Some(Peer {
            uid: cred.uid(),
            gid: cred.gid(),
            pid,
            groups,
        })
    }

    /// Whether the peer's primary or supplementary groups include `gid`.
    pub fn in_group(&self, gid: u32) -> bool {
        self.gid == gid || self.groups.contains(&gid)
    }

    /// `uid 1000 (alice)`, or `uid 1000` when the user has no name.
    fn describe(&self) -> String {
        match User::from_uid(Uid::from_raw(self.uid)) {
            Ok(Some(user)) => format!("uid {} ({})", self.uid, user.name),
            _ => format!("uid {}", self.uid),
        }
    }
}

fn groups_from_database(uid: u32, gid: u32) -> Vec<u32> {
    let Ok(Some(user)) = User::from_uid(Uid::from_raw(uid)) else {
        return Vec::new();
    };
    let Ok(name) = std::ffi::CString::new(user.name) else {
        return Vec::new();
    };
    nix::unistd::getgrouplist(&name, Gid::from_raw(gid))
        .map(|groups| groups.into_iter().map(Gid::as_raw).collect())
        .unwrap_or_default()
}

/// The control operations, each with its rule and the ttctl command that
/// calls it (refusals name the command the operator typed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    /// `ttctl status`.
    Status,
    /// `ttctl status --watch`.
    WatchStatus,
    /// `ttctl logs`.
    Logs,
    /// `ttctl cache ls` and `cache verify`.
    ListCache,
    /// `ttctl generate`: the same use as the public port.
    Generate,
    /// `ttctl reload --dry-run`: reads the config file and shows the plan,
    /// applying and recording nothing.
    ReloadDryRun,
    /// `ttctl card reset`.
    ResetCard,
    /// `ttctl card borrow`.
    BorrowCards,
    /// `ttctl cache rm`.
    RemoveCache,
    /// `ttctl cache build`.
    BuildCache,
    /// `ttctl cache verify`: reads every cached byte and invalidates a
    /// variant that does not match.
    VerifyCache,
    /// `ttctl slot restart`.
    RestartSlot,
    /// `ttctl slot stop`.
    StopSlot,
    /// `ttctl slot start`.
    StartSlot,
    /// `ttctl reload`.
    Reload,
    /// `ttctl ab`: trial definitions of a model.
    Trial,
    /// `ttctl audit`: the trail of control actions (who did what is no
    /// secret from whoever may see the cards and slots it changed).
    ReadAudit,
    /// `ttctl usage`: usage per API key (key names, never tokens).
    ReadUsage,
}

impl Operation {
    /// Whether the operation changes cards, slots, caches or the config.
    pub fn is_destructive(self) -> bool {
        !matches!(
            self,
            Operation::Status
                | Operation::WatchStatus
                | Operation::Logs
                | Operation::ListCache
                | Operation::Generate
                | Operation::ReloadDryRun
                | Operation::ReadAudit
                | Operation::ReadUsage
        )
    }

    /// The ttctl command an operator types for it.
    pub fn command(self) -> &'static str {
        match self {
            Operation::Status => "ttctl status",
            Operation::WatchStatus => "ttctl status --watch",
            Operation::Logs => "ttctl logs",
            Operation::ListCache => "ttctl cache ls",
            Operation::Generate => "ttctl generate",
            Operation::ReloadDryRun => "ttctl reload --dry-run",
            Operation::ResetCard => "ttctl card reset",
            Operation::BorrowCards => "ttctl card borrow",
            Operation::RemoveCache => "ttctl cache rm",
            Operation::BuildCache => "ttctl cache build",
            Operation::VerifyCache => "ttctl cache verify",
            Operation::RestartSlot => "ttctl slot restart",
            Operation::StopSlot => "ttctl slot stop",
            Operation::StartSlot => "ttctl slot start",
            Operation::Reload => "ttctl reload",
            Operation::Trial => "ttctl ab",
            Operation::ReadAudit => "ttctl audit",
            Operation::ReadUsage => "ttctl usage",
        }
    }
}

/// The gid of group `name`, named by config key `key` in errors. The one
/// lookup behind the admin rule, the control socket's group and
/// `check-config`, so they cannot disagree.
pub fn group_id(name: &str, key: &str) -> anyhow::Result<u32> {
    match Group::from_name(name) {
        Ok(Some(group)) => Ok(group.gid.as_raw()),
        Ok(None) => anyhow::bail!(
            "group `{name}` ({key}) does not exist; create it (groupadd {name}) or change the config"
        ),
        Err(e) => anyhow::bail!("cannot look up group `{name}` ({key}): {e}"),
    }
}

/// The admin rule in force: root, plus the members of one group if
/// configured. Resolved once at startup so a missing group stops the daemon
/// with a clear message instead of refusing every operator later.
#[derive(Debug, Clone, Default)]
pub struct AdminRule {
    /// `daemon.control_admin_group`, by name and gid.
    group: Option<(String, u32)>,
}

impl AdminRule {
    /// Resolve `daemon.control_admin_group`.
    pub fn resolve(group: Option<&str>) -> anyhow::Result<AdminRule> {
        let Some(name) = group else {
            return Ok(AdminRule::default());
        };
        let gid = group_id(name, "daemon.control_admin_group")?;
        Ok(AdminRule::with_group(name, gid))
    }

    /// A rule admitting root and the members of `gid`.
    pub fn with_group(name: &str, gid: u32) -> AdminRule {
        AdminRule {
            group: Some((name.to_string(), gid)),
        }
    }

    /// Decide whether `peer` may perform `op`. Refusals are
    /// PERMISSION_DENIED naming the rule, the config key and the caller.
    pub fn check(&self, peer: Option<&Peer>, op: Operation) -> Result<(), Status> {
        if !op.is_destructive() {
            return Ok(());
        }
        let needs = match &self.group {
            Some((name, _)) => format!(
                "{} needs root or membership in group `{name}` (daemon.control_admin_group)",
                op.command()
            ),
            None => format!(
                "{} needs root (set daemon.control_admin_group to let a group's members use it)",
                op.command()
            ),
        };
        let Some(peer) = peer else {
            return Err(Status::permission_denied(format!(
                "{needs}; the daemon could not read this connection's credentials (SO_PEERCRED), so it refuses"
            )));
        };
        let member = self
            .group
            .as_ref()
            .is_some_and(|(_, gid)| peer.in_group(*gid));
        if peer.uid == 0 || member {
            tracing::info!(uid = peer.uid, pid = ?peer.pid, operation = op.command(), "control operation allowed");
            return Ok(());
        }
        let who = peer.describe();
        tracing::warn!(caller = %who, pid = ?peer.pid, operation = op.command(), "control operation refused");
        Err(Status::permission_denied(match &self.group {
            Some(_) => format!("{needs}; {who} is in neither"),
            None => format!("{needs}; {who} is not root"),
        }))
    }

    /// On what grounds `peer` may perform destructive operations, as the
    /// audit trail records it: `root`, `group <name>` (the admin group), or
    /// None when it may not.
    pub fn basis(&self, peer: &Peer) -> Option<String> {
        if peer.uid == 0 {
            return Some("root".to_string());
        }
        match &self.group {
            Some((name, gid)) if peer.in_group(*gid) => Some(format!("group {name}")),
            _ => None,
        }
    }

    /// Whether the caller of `request` may perform destructive operations
    /// (root or the admin group), decided quietly: for choosing what a
    /// read-only answer shows.
    pub fn is_admin<T>(&self, request: &Request<T>) -> bool {
        let peer = request
            .extensions()
            .get::<PeerInfo>()
            .and_then(Option::as_ref);
        peer.is_some_and(|p| {
            p.uid == 0 || self.group.as_ref().is_some_and(|(_, gid)| p.in_group(*gid))
        })
    }

    /// [`AdminRule::check`] for a request arriving on the control socket.
    pub fn authorize<T>(&self, request: &Request<T>, op: Operation) -> Result<(), Status> {
        let peer = request
            .extensions()
            .get::<PeerInfo>()
            .and_then(Option::as_ref);
        self.check(peer, op)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(uid: u32, gid: u32, groups: &[u32]) -> Peer {
        Peer {
            uid,
            gid,
            pid: None,
            groups: groups.to_vec(),
        }
    }

    const DESTRUCTIVE: [Operation; 10] = [
        Operation::StopSlot,
        Operation::StartSlot,
        Operation::Trial,
        Operation::VerifyCache,
        Operation::ResetCard,
        Operation::BorrowCards,
        Operation::RemoveCache,
        Operation::BuildCache,
        Operation::RestartSlot,
        Operation::Reload,
    ];
    const READ_ONLY: [Operation; 8] = [
        Operation::ReadAudit,
        Operation::ReadUsage,
        Operation::Status,
        Operation::WatchStatus,
        Operation::Logs,
        Operation::ListCache,
        Operation::Generate,
        Operation::ReloadDryRun,
    ];

    #[test]
    fn read_only_operations_are_open_to_whoever_connected() {
        let rule = AdminRule::with_group("tt-admin", 4242);
        for op in READ_ONLY {
            assert!(
                rule.check(Some(&peer(1000, 100, &[])), op).is_ok(),
                "{op:?}"
            );
            assert!(rule.check(None, op).is_ok(), "{op:?}");
        }
    }

    #[test]
    fn root_may_do_everything() {
        for rule in [
            AdminRule::default(),
            AdminRule::with_group("tt-admin", 4242),
        ] {
            for op in DESTRUCTIVE {
                assert!(rule.check(Some(&peer(0, 0, &[])), op).is_ok(), "{op:?}");
            }
        }
    }

    #[test]
    fn admin_group_by_primary_or_supplementary_membership() {
        let rule = AdminRule::with_group("tt-admin", 4242);
        assert!(rule
            .check(Some(&peer(1000, 4242, &[])), Operation::ResetCard)
            .is_ok());
        assert!(rule
            .check(Some(&peer(1000, 100, &[27, 4242])), Operation::Reload)
            .is_ok());
    }

    #[test]
    fn refusal_names_the_command_the_rule_the_key_and_the_caller() {
        let rule = AdminRule::with_group("tt-admin", 4242);
        let err = rule
            .check(Some(&peer(999_999, 100, &[27])), Operation::ResetCard)
            .unwrap_err();
        assert_eq!(err.code(), tonic::Code::PermissionDenied);
        assert_eq!(
            err.message(),
            "ttctl card reset needs root or membership in group `tt-admin` (daemon.control_admin_group); uid 999999 is in neither"
        );
        for op in DESTRUCTIVE {
            let err = rule.check(Some(&peer(999_999, 100, &[])), op).unwrap_err();
            assert!(err.message().starts_with(op.command()), "{}", err.message());
        }
    }

    #[test]
    fn without_an_admin_group_only_root_and_the_message_says_how_to_widen() {
        let err = AdminRule::default()
            .check(Some(&peer(999_999, 100, &[])), Operation::RestartSlot)
            .unwrap_err();
        assert_eq!(
            err.message(),
            "ttctl slot restart needs root (set daemon.control_admin_group to let a group's members use it); uid 999999 is not root"
        );
    }

    #[test]
    fn the_basis_of_an_admission_is_root_or_the_group() {
        let rule = AdminRule::with_group("tt-admin", 4242);
        assert_eq!(rule.basis(&peer(0, 0, &[])).as_deref(), Some("root"));
        assert_eq!(
            rule.basis(&peer(1000, 100, &[4242])).as_deref(),
            Some("group tt-admin")
        );
        assert_eq!(rule.basis(&peer(1000, 100, &[])), None);
        assert_eq!(AdminRule::default().basis(&peer(1000, 4242, &[])), None);
    }

    #[test]
    fn unknown_credentials_are_refused_destructive_operations() {
        let err = AdminRule::default()
            .check(None, Operation::BorrowCards)
            .unwrap_err();
        assert_eq!(err.code(), tonic::Code::PermissionDenied);
        assert!(err.message().contains("SO_PEERCRED"), "{}", err.message());
    }

    #[test]
    fn user_names_appear_when_known() {
        // uid 0 always has a name; check the format through a non-root
        // refusal of a user that exists on any Linux: `nobody`, when present.
        if let Ok(Some(nobody)) = User::from_name("nobody") {
            let err = AdminRule::default()
                .check(
                    Some(&peer(nobody.uid.as_raw(), nobody.gid.as_raw(), &[])),
                    Operation::ResetCard,
                )
                .unwrap_err();
            assert!(
                err.message()
                    .ends_with(&format!("uid {} (nobody) is not root", nobody.uid)),
                "{}",
                err.message()
            );
        }
    }

    #[test]
    fn a_peers_groups_are_the_kernels_list_for_its_pid() {
        let mut from_proc = tt_card_lock::procs::groups(std::process::id()).unwrap();
        let mut from_kernel: Vec<u32> = nix::unistd::getgroups()
            .unwrap()
            .into_iter()
            .map(Gid::as_raw)
            .collect();
        from_proc.sort_unstable();
        from_kernel.sort_unstable();
        from_kernel.dedup();
        assert_eq!(from_proc, from_kernel);
    }

    #[test]
    fn missing_admin_group_stops_startup_with_the_fix() {
        let err = AdminRule::resolve(Some("no-such-group-tt-serving")).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("daemon.control_admin_group"), "{text}");
        assert!(text.contains("does not exist"), "{text}");
        assert!(AdminRule::resolve(Some("root")).is_ok());
    }
}
