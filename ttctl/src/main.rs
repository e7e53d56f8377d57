//! `ttctl`, the operator's tool for tt-servingd. Everything lives in
//! the library ([`ttctl`]); this file only parses the command line and runs it.

use std::process::ExitCode;

use clap::Parser;
use ttctl::{self as ctl, Cli};

// One thread is plenty for a client that waits on one socket.
#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    // Usage errors exit 2 here, inside clap.
    let cli = Cli::parse();
    if let Err(e) = cli.check() {
        e.exit();
    }
    ctl::run(cli).await
}
