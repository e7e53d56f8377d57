//! `ttctl`, the operator's tool for tt-servingd. Everything lives in
//! [`tt_servingd::ctl`]; this file only parses the command line and runs it.

use std::process::ExitCode;

use clap::Parser;
use tt_servingd::ctl::{self, Cli};

// One thread is plenty for a client that waits on one socket.
#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    // Usage errors exit 2 here, inside clap.
    let cli = Cli::parse();
    ctl::run(cli).await
}
