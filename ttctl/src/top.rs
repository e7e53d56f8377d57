//! `ttctl top`: poll status and redraw rates and latencies per slot.

use std::io::Write;
use std::time::{Duration, Instant};

use tt_serving_proto::v1::StatusResponse;

use super::args::TopArgs;
use super::client::Daemon;
use super::outcome::{ctrl_c_pressed, emit, Failure};
use super::render::top_frame;
use super::status::{now_unix_ms, CLEAR_SCREEN};

/// Draw frames every `interval` until Ctrl-C or `iterations` frames. On a
/// terminal each frame replaces the last; otherwise frames follow each
/// other, separated by a blank line.
pub(super) async fn run(
    daemon: &mut Daemon,
    args: TopArgs,
    out: &mut (dyn Write + Send),
    is_tty: bool,
) -> Result<(), Failure> {
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    let interval = Duration::from_secs_f64(args.interval);
    let mut previous: Option<(StatusResponse, Instant)> = None;
    let mut frames = 0u32;
    loop {
        let snapshot = daemon.status().await?;
        let taken = Instant::now();
        let before = previous
            .as_ref()
            .map(|(s, at)| (s, taken.duration_since(*at).as_secs_f64()));
        let mut text = top_frame(&snapshot, before, now_unix_ms());
        if is_tty {
            text.insert_str(0, CLEAR_SCREEN);
        } else if frames > 0 {
            text.insert(0, '\n');
        }
        emit(out, &text)?;
        frames += 1;
        if args.iterations > 0 && frames >= args.iterations {
            return Ok(());
        }
        previous = Some((snapshot, taken));
        tokio::select! {
            signal = &mut ctrl_c => return ctrl_c_pressed(signal),
            _ = tokio::time::sleep(interval) => {}
        }
    }
}
