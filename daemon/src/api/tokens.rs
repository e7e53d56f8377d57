//! Bearer tokens for the public port (`inference.tokens_file`).
//!
//! Tokens come only from the file, never from the command line or the
//! environment (both are visible to other local users), and are never
//! logged. The daemon keeps only their SHA-256 digests; a presented token is
//! hashed and compared with every digest in constant time, so neither the
//! comparison's timing nor its length reveals how much of a token matched.
//!
//! The file: one token per line, optionally followed by whitespace and the
//! key's name (`[A-Za-z0-9_.-]{1,64}`), which usage is counted under
//! (`tt_serving_key_*` metrics, `ttctl usage`). A token without a name is
//! named `key-` and the first 8 hex digits of its SHA-256 digest: stable,
//! and never any part of the token itself. Tokens cannot contain spaces,
//! so files of bare tokens load as before.
//!
//! A line may end with `min_priority=<N>` (#45): the most urgent (lowest)
//! request `priority` the key may ask (lower is sooner, as vLLM's); without
//! it, 0. A request asking more urgent is refused, naming the key and its
//! limit, never clamped. Names cannot contain `=`, so older files load as
//! before. It may also end with `max_in_flight=<N>` (#54): the key's
//! requests admitted at once, every model together (`router/keys.rs`).

use crate::usage::{InFlightCap, KeyName, ANONYMOUS, DEFAULT_MIN_PRIORITY};
use std::collections::HashMap;
use std::sync::atomic::AtomicU32;

use crate::secrets;
use sha2::{Digest, Sha256};
use std::path::Path;
use std::sync::Arc;
use subtle::ConstantTimeEq;
use tonic::metadata::MetadataMap;
use tonic::{Request, Status};

/// The accepted tokens, as digests.
pub struct Tokens {
    /// SHA-256 of each token.
    digests: Vec<[u8; 32]>,
    /// Each token's key name, by the digest's index.
    names: Vec<KeyName>,
    /// The file they came from, for messages.
    source: String,
}

impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Tokens({} from {})", self.digests.len(), self.source)
    }
}

const KEY: &str = "inference.tokens_file";

impl Tokens {
    /// Read the tokens file. Refused: a file every user can read, a file
    /// without tokens, a line that cannot be a token (named by line number,
    /// never by content).
    pub fn load(path: &Path) -> anyhow::Result<Tokens> {
        let bytes = secrets::read(path, KEY)?;
        let text = String::from_utf8(bytes).map_err(|_| {
            anyhow::anyhow!(
                "{} ({KEY}) is not UTF-8 text; write one token per line",
                path.display()
            )
        })?;
        Tokens::parse(&text, &path.display().to_string())
    }

    /// Parse one token per line, each optionally followed by its name;
    /// `#` comments and blank lines are ignored.
    fn parse(text: &str, source: &str) -> anyhow::Result<Tokens> {
        let mut digests = Vec::new();
        let mut names = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let mut words = line.split_whitespace();
            let token = words.next().unwrap_or_default();
            // After the token: its name (no `=` in a name) and attributes
            // (`key=value`), the name first.
            let (attributes, plain): (Vec<&str>, Vec<&str>) = words.partition(|w| w.contains('='));
            if plain.len() > 1 {
                anyhow::bail!(
                    "{source} ({KEY}) line {}: more than a token and its name; write `<token>`, `<token> <name>` or `<token> <name> min_priority=<N> max_in_flight=<N>` per line",
                    i + 1
                );
            }
            let name = plain.first().copied();
            let mut min_priority = DEFAULT_MIN_PRIORITY;
            let mut max_in_flight = None;
            for attribute in attributes {
                match attribute_of(attribute)
                    .map_err(|why| anyhow::anyhow!("{source} ({KEY}) line {}: {why}", i + 1))?
                {
                    Attribute::MinPriority(n) => min_priority = n,
                    Attribute::MaxInFlight(n) => max_in_flight = Some(n),
                }
            }
            // Tokens travel in an HTTP/2 header after `Bearer `: visible
            // ASCII without spaces is what every client can send.
            if !token.bytes().all(|b| b.is_ascii_graphic()) {
                anyhow::bail!(
                    "{source} ({KEY}) line {}: a token may contain only printable ASCII without spaces (one token per line); fix or remove that line",
                    i + 1
                );
            }
            let d = digest(token);
            let name = match name {
                None => derived_name(&d),
                Some(n) if n == ANONYMOUS => anyhow::bail!(
                    "{source} ({KEY}) line {}: `{ANONYMOUS}` is the name of requests without a token; name this token otherwise",
                    i + 1
                ),
                Some(n) => KeyName::new(n).ok_or_else(|| {
                    anyhow::anyhow!(
                        "{source} ({KEY}) line {}: a token's name is 1 to 64 of A-Z a-z 0-9 _ . -; fix the name on that line",
                        i + 1
                    )
                })?,
            };
            digests.push(d);
            names.push((name.with_min_priority(min_priority), max_in_flight));
        }
        // Lines of one name are one key: they share one cap and one count
        // (the last cap given for the name holds).
        let mut caps: HashMap<&str, u32> = HashMap::new();
        for (name, max) in &names {
            if let Some(max) = max {
                caps.insert(name.as_str(), *max);
            }
        }
        let caps: HashMap<String, Arc<InFlightCap>> = caps
            .into_iter()
            .map(|(name, max)| {
                let cap = InFlightCap {
                    max,
                    now: AtomicU32::new(0),
                };
                (name.to_string(), Arc::new(cap))
            })
            .collect();
        let names = names
            .into_iter()
            .map(|(name, _)| {
                let cap = caps.get(name.as_str()).cloned();
                name.with_cap(cap)
            })
            .collect();
        if digests.is_empty() {
            anyhow::bail!(
                "{source} ({KEY}) has no tokens; add one per line (e.g. `openssl rand -hex 32 >> {source}`) or remove {KEY} to serve without authentication"
            );
        }
        Ok(Tokens {
            digests,
            names,
            source: source.to_string(),
        })
    }

    /// How many tokens are accepted.
    pub fn len(&self) -> usize {
        self.digests.len()
    }

    /// The key name of `token` when it is one of ours. Every digest is
    /// compared, whatever matched earlier, and the match is picked without
    /// a branch on it.
    fn accepts(&self, token: &str) -> Option<&KeyName> {
        use subtle::ConditionallySelectable;
        let presented = digest(token);
        let mut matched = subtle::Choice::from(0);
        let mut index = 0u32;
        for (i, d) in self.digests.iter().enumerate() {
            let eq = d.ct_eq(&presented);
            index.conditional_assign(&u32::try_from(i).unwrap_or(u32::MAX), eq);
            matched |= eq;
        }
        if bool::from(matched) {
            self.names.get(index as usize)
        } else {
            None
        }
    }

    /// Check a request's `authorization: Bearer <token>` metadata: the
    /// token's key name.
    pub fn check(&self, metadata: &MetadataMap) -> Result<KeyName, Status> {
        let value = metadata.get("authorization").map(|v| v.to_str());
        let value = match value {
            Some(Ok(v)) => Some(v),
            Some(Err(_)) => Some(""),
            None => None,
        };
        self.check_bearer(
            value,
            "metadata `authorization: Bearer <token>` (grpcurl: -H 'authorization: Bearer <token>')",
        )
            .map_err(Status::unauthenticated)
    }

    /// Check an `authorization` value (None: absent), whatever protocol
    /// carried it; `how` says how to send one. The refusal says why, never
    /// the token. Accepted: the token's key name.
    pub fn check_bearer(&self, value: Option<&str>, how: &str) -> Result<KeyName, String> {
        let Some(value) = value else {
            return Err(format!(
                "this endpoint needs a bearer token: send the {how} with a token from the daemon's inference.tokens_file; ask the operator for one"
            ));
        };
        let malformed = || {
            format!(
                "the `authorization` value is not a bearer token; send the {how} with a token from the daemon's inference.tokens_file"
            )
        };
        let (scheme, token) = value.trim().split_once(' ').ok_or_else(malformed)?;
        let token = token.trim();
        if !scheme.eq_ignore_ascii_case("bearer") || token.is_empty() {
            return Err(malformed());
        }
        if let Some(name) = self.accepts(token) {
            Ok(name.clone())
        } else {
            Err("the bearer token is not accepted: it is none of the tokens in the daemon's inference.tokens_file; check it for typos or ask the operator for a current one".into())
        }
    }
}

/// The attribute `min_priority=<N>`: the most urgent (lowest) `priority`
/// the key may ask. The error says what is wrong without quoting the line
/// (a mistyped line may hold a token).
/// An attribute after a token and its name.
enum Attribute {
    /// `min_priority=<N>`.
    MinPriority(i32),
    /// `max_in_flight=<N>`.
    MaxInFlight(u32),
}

fn attribute_of(attribute: &str) -> Result<Attribute, String> {
    let (name, value) = attribute.split_once('=').unwrap_or((attribute, ""));
    match name {
        "min_priority" => value.parse::<i32>().map(Attribute::MinPriority).map_err(|_| {
            "min_priority must be a whole number within a 32-bit integer (lower is sooner, e.g. min_priority=-5); fix the limit on that line".to_string()
        }),
        "max_in_flight" => value
            .parse::<u32>()
            .ok()
            .filter(|n| (1..=1_000_000).contains(n))
            .map(Attribute::MaxInFlight)
            .ok_or_else(|| {
                "max_in_flight must be a whole number from 1 to 1000000 (the key's requests admitted at once, e.g. max_in_flight=4); fix the cap on that line, or remove it for no cap".to_string()
            }),
        _ => Err("an unknown attribute; the known ones are `min_priority=<N>` (the most urgent priority the key may ask; lower is sooner) and `max_in_flight=<N>` (the key's requests admitted at once), after the token and its name".into()),
    }
}

fn digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

/// The name of a token the file names not: `key-` and the digest's first
/// four bytes in hex (a digest reveals nothing of the token).
fn derived_name(digest: &[u8; 32]) -> KeyName {
    let hex: String = digest[..4].iter().map(|b| format!("{b:02x}")).collect();
    KeyName::new(&format!("key-{hex}")).unwrap_or_default()
}

/// The interceptor in front of Inference and reflection: passes everything
/// when no tokens are configured.
#[derive(Clone, Debug, Default)]
pub struct TokenCheck {
    /// The accepted tokens; None: no authentication.
    tokens: Option<Arc<Tokens>>,
}

impl TokenCheck {
    /// Check against `tokens`, or let everything through when None.
    pub fn new(tokens: Option<Tokens>) -> TokenCheck {
        TokenCheck {
            tokens: tokens.map(Arc::new),
        }
    }

    /// Whether tokens are required.
    pub fn enabled(&self) -> bool {
        self.tokens.is_some()
    }

    /// Check an HTTP `Authorization` header (None: absent): the key name
    /// the request counts under; anonymous when no tokens are configured.
    pub fn check_http(&self, authorization: Option<&str>) -> Result<KeyName, String> {
        match &self.tokens {
            None => Ok(KeyName::anonymous()),
            Some(tokens) => {
                tokens.check_bearer(authorization, "header `Authorization: Bearer <token>`")
            }
        }
    }
}

impl tonic::service::Interceptor for TokenCheck {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        match &self.tokens {
            None => {
                request.extensions_mut().insert(KeyName::anonymous());
                Ok(request)
            }
            Some(tokens) => match tokens.check(request.metadata()) {
                Ok(name) => {
                    request.extensions_mut().insert(name);
                    Ok(request)
                }
                Err(status) => {
                    // The refusal's reason, never the token.
                    tracing::debug!(
                        reason = status.message(),
                        "refused an unauthenticated request on the inference port"
                    );
                    Err(status)
                }
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;
    use tonic::service::Interceptor;

    fn tokens(text: &str) -> Tokens {
        Tokens::parse(text, "/etc/tt-serving/tokens").unwrap()
    }

    fn request(authorization: Option<&str>) -> Request<()> {
        let mut request = Request::new(());
        if let Some(value) = authorization {
            request
                .metadata_mut()
                .insert("authorization", value.parse().unwrap());
        }
        request
    }

    #[test]
    fn comments_and_blank_lines_are_skipped() {
        let t = tokens("# ops team\n\nalpha-123\n  beta-456  \n# old: gamma\n");
        assert_eq!(t.len(), 2);
        assert!(t.accepts("alpha-123").is_some());
        assert!(t.accepts("beta-456").is_some());
        assert!(t.accepts("gamma").is_none());
        assert!(t.accepts("alpha-12").is_none());
        assert!(t.accepts("").is_none());
    }

    #[test]
    fn names_follow_their_token_and_old_files_load_unchanged() {
        let t = tokens("alpha-123 team-a\n  beta-456\tteam.b  \nbare:token\n");
        assert_eq!(t.len(), 3);
        assert_eq!(t.accepts("alpha-123").unwrap().as_str(), "team-a");
        assert_eq!(t.accepts("beta-456").unwrap().as_str(), "team.b");
        // A bare token (colons included) is a token, named from its digest.
        let derived = t.accepts("bare:token").unwrap().as_str().to_string();
        assert!(
            derived.starts_with("key-") && derived.len() == 12,
            "{derived}"
        );
        assert!(!derived.contains("bare") && !derived.contains("token"));
        assert_eq!(
            tokens("bare:token\n")
                .accepts("bare:token")
                .unwrap()
                .as_str(),
            derived
        );
        assert!(t.accepts("team-a").is_none());
    }

    #[test]
    fn a_bad_name_is_refused_by_line_number() {
        for (text, why) in [
            ("ok-token\nsecretpart bad/name\n", "a token's name"),
            ("secretpart anonymous\n", "without a token"),
            ("secretpart a b\n", "more than a token"),
        ] {
            let err = Tokens::parse(text, "/x/tokens").unwrap_err().to_string();
            assert!(err.contains(why), "{err}");
            assert!(err.contains("line"), "{err}");
            assert!(!err.contains("secretpart"), "{err}");
        }
    }

    #[test]
    fn a_priority_limit_follows_the_name_and_older_lines_still_load() {
        let t = tokens(
            "# comment\nbare-token\nnamed-token team-a\nurgent-token ops min_priority=-5\nnameless-token min_priority=3\n",
        );
        let limit = |token: &str| t.accepts(token).unwrap().min_priority();
        assert_eq!(limit("bare-token"), 0);
        assert_eq!(limit("named-token"), 0);
        assert_eq!(t.accepts("urgent-token").unwrap().as_str(), "ops");
        assert_eq!(limit("urgent-token"), -5);
        assert!(t
            .accepts("nameless-token")
            .unwrap()
            .as_str()
            .starts_with("key-"));
        assert_eq!(limit("nameless-token"), 3);
    }

    #[test]
    fn a_bad_priority_limit_is_refused_by_line_number() {
        for (text, why) in [
            (
                "ok\nsecretpart ops min_priority=soon\n",
                "min_priority must be a whole number",
            ),
            (
                "ok\nsecretpart ops min_priority=99999999999\n",
                "min_priority must be a whole number",
            ),
            ("ok\nsecretpart ops max_priority=1\n", "unknown attribute"),
            (
                "ok\nsecretpart ops other min_priority=1\n",
                "more than a token",
            ),
        ] {
            let err = Tokens::parse(text, "/x/tokens").unwrap_err().to_string();
            assert!(err.contains(why), "{err}");
            assert!(err.contains("line 2"), "{err}");
            assert!(!err.contains("secretpart"), "{err}");
        }
    }

    #[test]
    fn an_in_flight_cap_follows_the_name_and_lines_of_one_name_share_it() {
        let t = tokens(
            "batch-1 batch max_in_flight=2\nbatch-2 batch\nchat-token chat min_priority=-1 max_in_flight=1\nfree-token free\n",
        );
        let cap = |token: &str| t.accepts(token).unwrap().cap().map(|c| c.max);
        assert_eq!(cap("batch-1"), Some(2));
        // The same name on another line is the same key: one cap, one count.
        assert_eq!(cap("batch-2"), Some(2));
        let one = t.accepts("batch-1").unwrap().cap().unwrap();
        let other = t.accepts("batch-2").unwrap().cap().unwrap();
        assert!(Arc::ptr_eq(one, other), "two caps for one key");
        assert_eq!(cap("chat-token"), Some(1));
        assert_eq!(t.accepts("chat-token").unwrap().min_priority(), -1);
        assert_eq!(cap("free-token"), None);
    }

    #[test]
    fn a_bad_in_flight_cap_is_refused_by_line_number() {
        for value in ["0", "-1", "many", "1000001", ""] {
            let text = format!("ok\nsecretpart ops max_in_flight={value}\n");
            let err = Tokens::parse(&text, "/x/tokens").unwrap_err().to_string();
            assert!(
                err.contains("max_in_flight must be a whole number"),
                "{err}"
            );
            assert!(err.contains("line 2"), "{err}");
            assert!(!err.contains("secretpart"), "{err}");
        }
    }

    #[test]
    fn the_interceptor_attaches_the_key_name() {
        let mut check = TokenCheck::new(Some(tokens("alpha-123 team-a\n")));
        let passed = check.call(request(Some("Bearer alpha-123"))).unwrap();
        assert_eq!(
            passed.extensions().get::<KeyName>().unwrap().as_str(),
            "team-a"
        );
        let mut open = TokenCheck::default();
        let passed = open.call(request(None)).unwrap();
        assert_eq!(
            passed.extensions().get::<KeyName>().unwrap().as_str(),
            ANONYMOUS
        );
        assert_eq!(open.check_http(None).unwrap().as_str(), ANONYMOUS);
    }

    #[test]
    fn a_file_without_tokens_is_refused() {
        let err = Tokens::parse("# nothing yet\n\n", "/x/tokens").unwrap_err();
        assert!(err.to_string().contains("has no tokens"), "{err}");
        assert!(err.to_string().contains("inference.tokens_file"), "{err}");
    }

    #[test]
    fn a_bad_line_is_named_by_number_not_content() {
        let err = Tokens::parse("good\nhas\u{7f}secretpart\n", "/x/tokens").unwrap_err();
        let text = err.to_string();
        assert!(text.contains("line 2"), "{text}");
        assert!(!text.contains("secretpart"), "{text}");
    }

    #[test]
    fn debug_output_hides_the_tokens() {
        let shown = format!(
            "{:?} {:?}",
            tokens("topsecret\n"),
            TokenCheck::new(Some(tokens("topsecret\n")))
        );
        assert!(!shown.contains("topsecret"), "{shown}");
    }

    #[test]
    fn missing_wrong_and_malformed_tokens_are_unauthenticated_with_the_fix() {
        let mut check = TokenCheck::new(Some(tokens("alpha-123\n")));
        let missing = check.call(request(None)).unwrap_err();
        assert_eq!(missing.code(), tonic::Code::Unauthenticated);
        assert!(missing.message().contains("authorization: Bearer <token>"));
        assert!(missing.message().contains("inference.tokens_file"));
        let wrong = check.call(request(Some("Bearer alpha-124"))).unwrap_err();
        assert_eq!(wrong.code(), tonic::Code::Unauthenticated);
        assert!(
            wrong.message().contains("not accepted"),
            "{}",
            wrong.message()
        );
        assert!(!wrong.message().contains("alpha"), "{}", wrong.message());
        for bad in ["alpha-123", "Basic alpha-123", "Bearer ", "Bearer"] {
            let err = check.call(request(Some(bad))).unwrap_err();
            assert_eq!(err.code(), tonic::Code::Unauthenticated, "{bad}");
            assert!(
                err.message().contains("not a bearer token"),
                "{bad}: {}",
                err.message()
            );
        }
        assert!(check.call(request(Some("Bearer alpha-123"))).is_ok());
        assert!(check.call(request(Some("bearer alpha-123"))).is_ok());
    }

    #[test]
    fn without_tokens_everything_passes() {
        let mut check = TokenCheck::default();
        assert!(!check.enabled());
        assert!(check.call(request(None)).is_ok());
    }

    #[test]
    fn load_refuses_a_world_readable_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokens");
        std::fs::write(&path, "alpha-123\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let err = Tokens::load(&path).unwrap_err().to_string();
        assert!(err.contains("every local user can read it"), "{err}");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
        assert_eq!(Tokens::load(&path).unwrap().len(), 1);
    }
}
