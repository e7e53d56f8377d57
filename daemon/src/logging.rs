//! The daemon's log: lines on stderr (plain or JSON, `daemon.log_format`;
//! under systemd the journal reads them from the stream), and, when stderr
//! is the journal, the audit trail's records sent to it as native journal
//! fields.
//!
//! Under systemd (`JOURNAL_STREAM` names the daemon's stderr, and the
//! journal's socket answers), each audit record ([`crate::audit`], the
//! events [`audit::is_record`] selects) goes to the journal over its
//! native protocol, one entry per record, with its fields as journal
//! fields prefixed [`FIELD_PREFIX`] (`TT_AUDIT_UID`, `TT_AUDIT_USER`,
//! `TT_AUDIT_PID`, `TT_AUDIT_ADMITTED`, `TT_AUDIT_OPERATION`,
//! `TT_AUDIT_ARGS`, `TT_AUDIT_OUTCOME`, `TT_AUDIT_DETAIL`,
//! `TT_AUDIT_TOOK_MS`), `SYSLOG_IDENTIFIER=tt-servingd` and the record's
//! summary as `MESSAGE`; the journal adds the unit (`_SYSTEMD_UNIT`) from
//! the sender's cgroup. The record then stays off stderr, so the journal
//! holds it once. `RUST_LOG` filters stderr only: the records reach the
//! journal whatever it says.
//!
//! Anywhere else (a terminal, a container, a test) nothing changes: the
//! records are lines on stderr with everything else.

use crate::audit;
use crate::config::LogFormat;
use std::ffi::OsStr;
use std::io::IsTerminal;
use tracing::Level;
use tracing_subscriber::filter::{filter_fn, EnvFilter, FilterExt, LevelFilter};
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{Layer, Registry};

/// The journal's `SYSLOG_IDENTIFIER` of the records (`journalctl -t`).
pub const SYSLOG_IDENTIFIER: &str = "tt-servingd";

/// The prefix of the records' journal fields: `uid` is `TT_AUDIT_UID`
/// (tracing-journald adds `_` and upper-cases the field's name).
pub const FIELD_PREFIX: &str = "TT_AUDIT";

/// A layer of the daemon's subscriber.
type Boxed = Box<dyn Layer<Registry> + Send + Sync>;

/// Install the daemon's log (once, at startup).
pub fn init(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let (journal, unreachable) = if stderr_is_journal() {
        match tracing_journald::layer() {
            Ok(layer) => (
                Some(
                    layer
                        .with_field_prefix(Some(FIELD_PREFIX.to_string()))
                        .with_syslog_identifier(SYSLOG_IDENTIFIER.to_string())
                        .boxed(),
                ),
                None,
            ),
            Err(e) => (None, Some(e)),
        }
    } else {
        (None, None)
    };
    let to_journal = journal.is_some();
    let ansi = std::io::stderr().is_terminal();
    if let Err(e) = subscriber(format, filter, ansi, std::io::stderr, journal).try_init() {
        eprintln!("tt-servingd: cannot install the log: {e}");
        return;
    }
    if to_journal {
        tracing::debug!("audit records go to the journal as native fields (TT_AUDIT_*)");
    } else if let Some(e) = unreachable {
        tracing::debug!(error = %e, "stderr is the journal but its socket cannot be reached; audit records stay log lines");
    }
}

/// The subscriber: `stderr` lines filtered by `filter`, and, with
/// `journal`, the audit records to it instead of to `stderr`.
fn subscriber<W>(
    format: LogFormat,
    filter: EnvFilter,
    ansi: bool,
    stderr: W,
    journal: Option<Boxed>,
) -> impl tracing::Subscriber + Send + Sync
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    let to_journal = journal.is_some();
    // The level hints keep the one `RUST_LOG` gives as the process's
    // (`tracing` and `log` skip what is below it at the call site).
    let lines = filter.and(
        filter_fn(move |meta| !(to_journal && audit::is_record(meta)))
            .with_max_level_hint(LevelFilter::TRACE),
    );
    let fmt = tracing_subscriber::fmt::layer()
        .with_target(false)
        .with_ansi(ansi)
        .with_writer(stderr);
    let stderr: Boxed = match format {
        LogFormat::Json => fmt.json().with_filter(lines).boxed(),
        LogFormat::Plain => fmt.with_filter(lines).boxed(),
    };
    let mut layers = vec![stderr];
    if let Some(journal) = journal {
        // Records are logged at INFO.
        let records = filter_fn(|meta| audit::is_record(meta) && *meta.level() <= Level::INFO)
            .with_max_level_hint(LevelFilter::INFO);
        layers.push(journal.with_filter(records).boxed());
    }
    tracing_subscriber::registry().with(layers)
}

/// Whether stderr is the journal's stream: systemd sets `JOURNAL_STREAM`
/// to its `device:inode` (a child that inherited the variable with
/// another stderr is not).
fn stderr_is_journal() -> bool {
    use std::os::fd::AsFd;
    use std::os::unix::fs::MetadataExt;
    let Some(stream) = std::env::var_os("JOURNAL_STREAM") else {
        return false;
    };
    let Ok(fd) = std::io::stderr().as_fd().try_clone_to_owned() else {
        return false;
    };
    match std::fs::File::from(fd).metadata() {
        Ok(meta) => names_stream(&stream, meta.dev(), meta.ino()),
        Err(_) => false,
    }
}

/// Whether `JOURNAL_STREAM`'s value names the file `dev`, `ino`.
fn names_stream(value: &OsStr, dev: u64, ino: u64) -> bool {
    let Some((d, i)) = value.to_str().and_then(|v| v.split_once(':')) else {
        return false;
    };
    d.parse::<u64>() == Ok(dev) && i.parse::<u64>() == Ok(ino)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};
    use tracing::field::{Field, Visit};
    use tracing_subscriber::layer::Context;

    /// stderr, kept.
    #[derive(Clone, Default)]
    struct Lines(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Lines {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'w> MakeWriter<'w> for Lines {
        type Writer = Lines;
        fn make_writer(&'w self) -> Lines {
            self.clone()
        }
    }

    impl Lines {
        fn text(&self) -> String {
            String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
        }
    }

    /// An event's fields: (name, value).
    type Entry = Vec<(String, String)>;

    /// The journal in place of the real one: each event's fields.
    #[derive(Clone, Default)]
    struct Journal(Arc<Mutex<Vec<Entry>>>);

    struct Fields<'a>(&'a mut Entry);

    impl Visit for Fields<'_> {
        fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
            self.0
                .push((field.name().to_string(), format!("{value:?}")));
        }
        fn record_str(&mut self, field: &Field, value: &str) {
            self.0.push((field.name().to_string(), value.to_string()));
        }
    }

    impl<S: tracing::Subscriber> Layer<S> for Journal {
        fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
            let mut fields = Vec::new();
            event.record(&mut Fields(&mut fields));
            self.0.lock().unwrap().push(fields);
        }
    }

    fn emit() {
        let record = audit::Record {
            at: "2026-12-05T15:25:03.042Z".into(),
            uid: Some(0),
            user: Some("root".into()),
            pid: Some(4242),
            admitted: "root".into(),
            operation: "ttctl card reset".into(),
            args: [("card".to_string(), "0".to_string())].into(),
            outcome: audit::Outcome::Ok,
            detail: "card back".into(),
            took_ms: 12,
        };
        let dir = tempfile::tempdir().unwrap();
        // Not a directory: the append fails and says so (FILE_TARGET).
        let file = dir.path().join("file");
        std::fs::write(&file, "").unwrap();
        audit::Trail::new(&file).append(&record);
        tracing::info!("slot smollm2-0 is ready");
    }

    #[test]
    fn under_the_journal_each_record_is_one_journal_entry_with_its_fields() {
        let lines = Lines::default();
        let journal = Journal::default();
        let subscriber = subscriber(
            LogFormat::Plain,
            EnvFilter::new("warn"),
            false,
            lines.clone(),
            Some(Box::new(journal.clone())),
        );
        // The most verbose of RUST_LOG's (warn) and the records' (info):
        // debug lines are still skipped at their call sites.
        assert_eq!(
            tracing::Subscriber::max_level_hint(&subscriber),
            Some(LevelFilter::INFO)
        );
        tracing::subscriber::with_default(subscriber, emit);
        let entries = journal.0.lock().unwrap().clone();
        assert_eq!(entries.len(), 1, "{entries:?}");
        let field = |name: &str| {
            entries[0]
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| v.as_str())
        };
        assert_eq!(field("uid"), Some("0"));
        assert_eq!(field("user"), Some("root"));
        assert_eq!(field("pid"), Some("4242"));
        assert_eq!(field("admitted"), Some("root"));
        assert_eq!(field("operation"), Some("ttctl card reset"));
        assert_eq!(field("args"), Some(r#"{"card":"0"}"#));
        assert_eq!(field("outcome"), Some("ok"));
        assert_eq!(field("detail"), Some("card back"));
        assert_eq!(field("took_ms"), Some("12"));
        assert_eq!(
            field("message"),
            Some("audit: control action: ttctl card reset by uid 0 (root): ok")
        );
        // stderr has the rest (RUST_LOG's warn: the append's error, not
        // the info line), and not the record.
        let text = lines.text();
        assert!(text.contains("cannot append to the audit trail"), "{text}");
        assert!(!text.contains("audit: control action"), "{text}");
        assert!(!text.contains("is ready"), "{text}");
    }

    #[test]
    fn elsewhere_the_record_is_a_line_on_stderr() {
        for format in [LogFormat::Plain, LogFormat::Json] {
            let lines = Lines::default();
            let subscriber = subscriber(format, EnvFilter::new("info"), false, lines.clone(), None);
            assert_eq!(
                tracing::Subscriber::max_level_hint(&subscriber),
                Some(LevelFilter::INFO)
            );
            tracing::subscriber::with_default(subscriber, emit);
            let text = lines.text();
            let record = text
                .lines()
                .find(|l| l.contains("audit: control action"))
                .unwrap_or_else(|| panic!("{text}"));
            assert!(record.contains("ttctl card reset"), "{record}");
            assert!(record.contains("uid"), "{record}");
            assert!(text.contains("cannot append to the audit trail"), "{text}");
            assert!(text.contains("is ready"), "{text}");
        }
    }

    #[test]
    fn journal_stream_names_a_device_and_inode() {
        assert!(names_stream(OsStr::new("8:1234"), 8, 1234));
        assert!(!names_stream(OsStr::new("8:1234"), 8, 1235));
        assert!(!names_stream(OsStr::new("8:1234"), 9, 1234));
        assert!(!names_stream(OsStr::new("8"), 8, 1234));
        assert!(!names_stream(OsStr::new(""), 0, 0));
        assert!(!names_stream(OsStr::new("x:y"), 0, 0));
    }
}
