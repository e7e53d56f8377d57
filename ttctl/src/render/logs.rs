//! `ttctl logs`: one line of a worker's output.

use tt_serving_proto::v1::LogLine;

/// One line of `ttctl logs`. The worker's own output (stdout and stderr)
/// is printed as it is, so the log reads and greps like the worker's
/// terminal; anything else the daemon sends (its notes, such as skipped
/// lines) is tagged with its source in brackets so it cannot be mistaken
/// for the worker's words.
pub fn log_line(line: &LogLine) -> String {
    match line.stream.as_str() {
        "stdout" | "stderr" | "" => line.text.clone(),
        tag => format!("[{tag}] {}", line.text),
    }
}
