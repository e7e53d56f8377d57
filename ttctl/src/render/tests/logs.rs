use tt_serving_proto::v1::LogLine;

use super::*;

#[test]
fn log_lines_print_worker_output_as_is_and_tag_daemon_notes() {
    let line = |stream: &str, text: &str| LogLine {
        unix_ms: NOW,
        stream: stream.into(),
        text: text.into(),
    };
    assert_eq!(
        log_line(&line("stdout", "loaded 32 layers")),
        "loaded 32 layers"
    );
    assert_eq!(
        log_line(&line("stderr", "Traceback (most recent call last):")),
        "Traceback (most recent call last):"
    );
    assert_eq!(
        log_line(&line("ttctl", "... 7 lines skipped ...")),
        "[ttctl] ... 7 lines skipped ..."
    );
}
