//! Quoting client input back in errors and logs. A client controls how long
//! a model name, slot name or cache key is; echoing it whole lets one request
//! write megabytes into a log line or a `grpc-message` header (which then
//! breaks the stream). Everything a client sent goes through [`echo`] first.

/// The most of one client-given string an error repeats.
pub const ECHO_MAX_BYTES: usize = 64;

/// `input` as it may appear in a message: control characters escaped (so a
/// name cannot forge a log line), cut after [`ECHO_MAX_BYTES`] bytes with an
/// ellipsis and the input's full length, so the reader still learns what
/// was sent and how big it was.
pub fn echo(input: &str) -> String {
    let mut cut = input.len().min(ECHO_MAX_BYTES);
    while !input.is_char_boundary(cut) {
        cut -= 1;
    }
    let mut out: String = input[..cut]
        .chars()
        .flat_map(|c| {
            let escaped: Vec<char> = if c.is_control() {
                c.escape_default().collect()
            } else {
                vec![c]
            };
            escaped
        })
        .collect();
    if cut < input.len() {
        out.push_str(&format!("… ({} bytes in all)", input.len()));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_input_is_repeated_as_is() {
        assert_eq!(echo("smollm2"), "smollm2");
        assert_eq!(echo(""), "");
    }

    #[test]
    fn long_input_is_cut_with_its_length() {
        let long = "m".repeat(1 << 20);
        let shown = echo(&long);
        assert_eq!(
            shown,
            format!("{}… (1048576 bytes in all)", "m".repeat(ECHO_MAX_BYTES))
        );
    }

    #[test]
    fn cuts_fall_on_character_boundaries() {
        // 'é' is two bytes: 63 'a' then 'é' straddles byte 64.
        let input = format!("{}é{}", "a".repeat(63), "b".repeat(10));
        let shown = echo(&input);
        assert!(shown.starts_with(&"a".repeat(63)), "{shown}");
        assert!(shown.ends_with("… (75 bytes in all)"), "{shown}");
    }

    #[test]
    fn control_characters_are_escaped() {
        assert_eq!(echo("a\nb\u{1b}"), "a\\nb\\u{1b}");
    }
}
