//! Turning the daemon's answers into what the operator reads: aligned
//! tables, one-line summaries, or JSON for scripts. One file per command
//! (`status`, `card`, `slot`, `generate`, `logs`, `audit`, `cache`,
//! `reload`, `top`), the JSON in `json`; this file holds what they share: the
//! [`Table`] and the words for durations and sizes.
//!
//! Everything here is a pure function of its inputs (the current time is a
//! parameter), so the output is pinned by unit tests (`tests/`) without a
//! daemon.
//!
//! The JSON is the protocol messages themselves (`json.rs` says why and
//! where it deliberately differs); enum values are the words the tables
//! print (`tt_serving_proto::Word`).

mod audit;
mod cache;
mod card;
mod generate;
mod json;
mod logs;
mod reload;
mod slot;
mod status;
mod top;
mod usage;

pub use audit::audit_line;
pub use cache::{cache_removed_line, cache_table, cache_verdict};
pub use card::reset_progress_line;
pub use generate::generate_summary;
pub use json::cache_json;
pub(super) use json::json_text;
pub use logs::log_line;
pub use reload::{last_reload_line, reload_failed_slots, reload_report_text};
pub use slot::{restart_step, slot_restart_requested_line, stop_step, RestartFollow, RestartStep};
pub use status::status_table;
pub use top::top_frame;
pub use usage::usage_table;

/// `42s`, `3m12s`, `2h03m`, `4d07h`.
fn duration_words(ms: u64) -> String {
    let s = ms / 1000;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        3600..86400 => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
        _ => format!("{}d{:02}h", s / 86400, s % 86400 / 3600),
    }
}

/// `-`, `812 MiB`, `10.3 GiB`.
fn bytes_words(bytes: u64) -> String {
    const MIB: u64 = 1 << 20;
    const GIB: u64 = 1 << 30;
    match bytes {
        0 => "-".to_string(),
        b if b < MIB => format!("{} KiB", b.div_ceil(1024)),
        b if b < GIB => format!("{} MiB", b / MIB),
        b => format!("{:.1} GiB", b as f64 / GIB as f64),
    }
}

/// `part` of `whole` as a whole percentage (`92%`), `-` when `whole` is 0.
fn percent_words(part: u64, whole: u64) -> String {
    if whole == 0 {
        "-".to_string()
    } else {
        format!("{:.0}%", part as f64 * 100.0 / whole as f64)
    }
}

fn or_dash(s: &str) -> &str {
    if s.is_empty() {
        "-"
    } else {
        s
    }
}

/// Daemon-supplied text (errors, tt-smi output) may span lines; a table row
/// must not, or the columns fall apart.
pub(crate) fn one_line(s: &str) -> String {
    s.split(|c: char| c.is_control())
        .map(str::trim)
        .filter(|part| !part.is_empty())
        .collect::<Vec<_>>()
        .join(" / ")
}

/// Left-aligned columns two spaces apart, with free-text notes (reasons,
/// processes) indented under the row they explain.
struct Table {
    headers: Vec<String>,
    lines: Vec<Line>,
}

enum Line {
    Row(Vec<String>),
    Note(String),
}

impl Table {
    fn new(headers: &[&str]) -> Self {
        Table {
            headers: headers.iter().map(|h| h.to_string()).collect(),
            lines: Vec::new(),
        }
    }

    fn row(&mut self, cells: Vec<String>) {
        self.lines.push(Line::Row(cells));
    }

    fn note(&mut self, text: String) {
        self.lines.push(Line::Note(text));
    }

    fn render(&self) -> String {
        // Widths in chars, not bytes: headers hold `°` and cells `—`.
        let mut widths: Vec<usize> = self.headers.iter().map(|h| h.chars().count()).collect();
        for line in &self.lines {
            if let Line::Row(cells) = line {
                for (w, cell) in widths.iter_mut().zip(cells) {
                    *w = (*w).max(cell.chars().count());
                }
            }
        }
        let mut out = String::new();
        push_cells(&mut out, &self.headers, &widths);
        for line in &self.lines {
            match line {
                Line::Row(cells) => push_cells(&mut out, cells, &widths),
                Line::Note(text) => {
                    out.push_str("    ");
                    out.push_str(text);
                    out.push('\n');
                }
            }
        }
        out
    }
}

fn push_cells(out: &mut String, cells: &[String], widths: &[usize]) {
    let start = out.len();
    for (cell, w) in cells.iter().zip(widths) {
        out.push_str(cell);
        let pad = w.saturating_sub(cell.chars().count()) + 2;
        out.extend(std::iter::repeat_n(' ', pad));
    }
    // The last column is not padded.
    let kept = out[start..].trim_end().len();
    out.truncate(start + kept);
    out.push('\n');
}

#[cfg(test)]
mod tests;
