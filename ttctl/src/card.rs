//! `ttctl card ...`: card maintenance.

use std::io::Write;

use super::client::Daemon;
use super::outcome::{emit, Failure};
use super::render::reset_progress_line;

/// `ttctl card reset <index|BDF>`: ask the daemon to reset the card and
/// print each step as it streams in. Success is the daemon's proof that the
/// card came back, never tt-smi's exit code (tt-smi exits 0 even when the
/// reset failed), so the exit code follows the final message's `ok`.
pub(super) async fn reset(
    daemon: &mut Daemon,
    card: &str,
    out: &mut (dyn Write + Send),
) -> Result<(), Failure> {
    let mut stream = daemon.reset_card(card).await?;
    while let Some(progress) = stream.next().await? {
        if !progress.finished {
            emit(out, &format!("{}\n", reset_progress_line(&progress)))?;
            continue;
        }
        // The final message is the final line: on stdout when the card is
        // proven back, as the error (stderr, exit 1) when it is not. The
        // daemon's text names the card, its new node or what to do next.
        if progress.ok {
            return emit(out, &format!("{}\n", reset_progress_line(&progress)));
        }
        return Err(Failure::Failed(if progress.message.is_empty() {
            format!("{} (see 'ttctl status')", reset_progress_line(&progress))
        } else {
            progress.message
        }));
    }
    Err(Failure::Failed(format!(
        "tt-servingd ended the reset of card {card} without a result; \
         see 'ttctl status' for the card's state"
    )))
}

/// `ttctl card borrow <cards> -- COMMAND...`: borrow cards from the daemon,
/// run the job holding their locks, and hand them back. The daemon resets
/// and proves the cards afterwards whatever the job did to them. If ttctl
/// dies mid-loan the daemon notices the closed stream and takes the cards
/// back itself.
pub(super) async fn borrow(
    daemon: &mut Daemon,
    cards: &[String],
    command: &[String],
    err: &mut (dyn Write + Send),
) -> Result<(), Failure> {
    use tt_serving_proto::v1::borrow_event::Kind;
    use tt_serving_proto::v1::borrow_request::Step;
    use tt_serving_proto::v1::{BorrowDone, BorrowRequest, BorrowStart};

    let status = daemon.status().await?;
    let lock_dir = std::path::PathBuf::from(status.daemon.map(|d| d.lock_dir).unwrap_or_default());
    let purpose = format!(
        "ttctl card borrow (pid {}): {}",
        std::process::id(),
        command.join(" ")
    );
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    let start = BorrowRequest {
        step: Some(Step::Start(BorrowStart {
            cards: cards.to_vec(),
            purpose: purpose.clone(),
        })),
    };
    tx.send(start)
        .await
        .map_err(|_| Failure::Failed("cannot start the loan".into()))?;
    let mut events = daemon.borrow_cards(rx).await?;
    let bdfs = loop {
        let event = events.next().await?.ok_or_else(|| {
            Failure::Failed("tt-servingd ended the loan before lending the cards".into())
        })?;
        match Kind::try_from(event.kind) {
            Ok(Kind::Lent) => break event.bdfs,
            _ => super::outcome::note(err, &format!("ttctl: {}\n", event.message)),
        }
    };
    // Take the same locks everyone uses, so no one else starts on the cards.
    // The job inherits them: if ttctl itself is killed, the locks live on
    // in the job's processes, and the daemon cannot take the cards back
    // (reset them, start a worker) while any of them runs.
    let mut locks = Vec::new();
    for bdf in &bdfs {
        let lock = tt_card_lock::try_lock(
            &lock_dir,
            bdf,
            &purpose,
            tt_card_lock::LockPolicy::borrower(),
        )
        .map_err(|e| {
            Failure::Failed(format!("the daemon lent {bdf} but its lock is taken: {e}"))
        })?;
        lock.share_with_children().map_err(|e| {
            Failure::Failed(format!("cannot hand the lock of {bdf} to the job: {e}"))
        })?;
        locks.push(lock);
    }
    super::outcome::note(
        err,
        &format!(
            "ttctl: holding {}; running {}\n",
            bdfs.join(","),
            command.join(" ")
        ),
    );
    let (program, args) = command
        .split_first()
        .ok_or_else(|| Failure::Failed("no command given after --".into()))?;
    // Orphans of the job (a grandchild whose parent exited) become ttctl's
    // children, so ttctl can end them with the job: the lease ends when
    // every process of the job is gone, not when its first process exits.
    if let Err(e) = nix::sys::prctl::set_child_subreaper(true) {
        super::outcome::note(
            err,
            &format!("ttctl: cannot adopt the job's orphans ({e}); processes it leaves behind keep the cards until they exit\n"),
        );
    }
    let exit = tokio::process::Command::new(program)
        .args(args)
        .env(tt_worker_contract::names::VISIBLE_DEVICES, bdfs.join(","))
        .status()
        .await;
    let leftovers = end_leftovers().await;
    if !leftovers.is_empty() {
        super::outcome::note(
            err,
            &format!(
                "ttctl: the job left {} process(es) behind ({}); ended them so the cards can go back\n",
                leftovers.len(),
                leftovers.join(", ")
            ),
        );
    }
    drop(locks);
    // A process of the job that escaped (left ttctl's tree) but kept the
    // inherited lock still holds the cards; the daemon waits for it.
    for bdf in &bdfs {
        if let Err(tt_card_lock::LockError::Held {
            holder: Some(h), ..
        }) = tt_card_lock::try_lock(
            &lock_dir,
            bdf,
            "ttctl card borrow (check)",
            tt_card_lock::LockPolicy::borrower(),
        ) {
            super::outcome::note(
                err,
                &format!(
                    "ttctl: card {bdf} is still held by {}; the daemon takes it back when that process exits\n",
                    h.describe()
                ),
            );
        }
    }
    let code: i32 = match &exit {
        Ok(status) => status.code().unwrap_or_else(|| {
            128 + std::os::unix::process::ExitStatusExt::signal(status).unwrap_or(0)
        }),
        Err(e) => {
            super::outcome::note(err, &format!("ttctl: cannot run {program}: {e}\n"));
            127
        }
    };
    let _ = tx
        .send(BorrowRequest {
            step: Some(Step::Done(BorrowDone { exit_code: code })),
        })
        .await;
    while let Some(event) = events.next().await? {
        match Kind::try_from(event.kind) {
            Ok(Kind::Returned) if event.ok => {
                super::outcome::note(err, &format!("ttctl: {}\n", event.message));
                break;
            }
            Ok(Kind::Returned) => {
                super::outcome::note(
                    err,
                    &format!("ttctl: the cards did not come back: {}\n", event.message),
                );
                break;
            }
            _ => super::outcome::note(err, &format!("ttctl: {}\n", event.message)),
        }
    }
    match code {
        0 => Ok(()),
        c => Err(Failure::JobExit(u8::try_from(c).unwrap_or(1))),
    }
}

/// ttctl's remaining children after the job's main process exited: the
/// job's orphans, adopted as subreaper. SIGTERM them, give them 5 s, then
/// SIGKILL, and reap them. Returns `pid (command)` of each.
async fn end_leftovers() -> Vec<String> {
    use nix::sys::signal::{kill, Signal};
    use nix::unistd::Pid;
    let me = std::process::id();
    let children = || -> Vec<u32> {
        tt_card_lock::procs::all()
            .into_iter()
            .filter(|p| p.ppid == me)
            .map(|p| p.pid)
            .collect()
    };
    let found = children();
    let described: Vec<String> = found
        .iter()
        .map(|pid| {
            let (_, command) = tt_card_lock::procs::identity(*pid);
            format!("pid {pid} ({command})")
        })
        .collect();
    for pid in &found {
        let _ = kill(Pid::from_raw(*pid as i32), Signal::SIGTERM);
    }
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        reap_exited();
        let left = children();
        if left.is_empty() {
            break;
        }
        if tokio::time::Instant::now() >= deadline {
            for pid in &left {
                let _ = kill(Pid::from_raw(*pid as i32), Signal::SIGKILL);
            }
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    described
}

/// Reap any exited child (adopted orphans are not tokio's to reap).
fn reap_exited() {
    use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
    while let Ok(status) = waitpid(None, Some(WaitPidFlag::WNOHANG)) {
        if status == WaitStatus::StillAlive {
            break;
        }
    }
}
