//! `ttctl audit`: one line per record.

use tt_serving_proto::v1::AuditRecord;

/// `2026-12-05T15:25:03.042Z uid 0 (root) [root] ttctl card reset card=0: ok: card ... proven back`:
/// when, who and on what grounds, what, the outcome and the final message
/// (its lines joined, so each record stays one line for grep).
pub fn audit_line(record: &AuditRecord) -> String {
    let who = match (record.uid, record.user.as_str()) {
        (Some(uid), "") => format!("uid {uid}"),
        (Some(uid), user) => format!("uid {uid} ({user})"),
        (None, _) => "uid ?".to_string(),
    };
    let mut line = format!(
        "{} {who} [{}] {}",
        record.at, record.admitted, record.operation
    );
    for (key, value) in &record.args {
        line.push_str(&format!(" {key}={value}"));
    }
    line.push_str(&format!(": {}", record.outcome));
    if !record.detail.is_empty() {
        line.push_str(&format!(": {}", record.detail.replace('\n', "; ")));
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_reads_as_who_what_and_how_it_ended() {
        let record = AuditRecord {
            at: "2026-12-05T15:25:03.042Z".into(),
            unix_ms: 1_796_484_303_042,
            uid: Some(65534),
            user: "nobody".into(),
            pid: Some(7),
            admitted: "refused".into(),
            operation: "ttctl card reset".into(),
            args: [("card".to_string(), "0".to_string())].into(),
            outcome: "refused".into(),
            detail: "ttctl card reset needs root\nsecond line".into(),
            took_ms: 0,
        };
        assert_eq!(
            audit_line(&record),
            "2026-12-05T15:25:03.042Z uid 65534 (nobody) [refused] ttctl card reset card=0: refused: ttctl card reset needs root; second line"
        );
    }
}
