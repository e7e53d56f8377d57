//! Entry points for the fuzz targets in `fuzz/fuzz_targets/` (cargo-fuzz,
//! nightly) and for the bounded stable run in this module's tests. Each
//! takes arbitrary bytes and checks properties; a panic is a finding, so
//! unlike the daemon's own code these assert freely.

use crate::config::{self, Config};
use prost::Message;
use tt_serving_proto::v1 as pb;

/// Config text: parsing never panics; every refusal names at least one
/// problem with a key path; an accepted config prints back to TOML that
/// parses to the same config.
pub fn config_text(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match config::parse(text) {
        Ok(config) => round_trip(&config),
        Err(problems) => {
            assert!(!problems.is_empty(), "refused without a problem: {text:?}");
            for p in &problems {
                assert!(
                    !p.to_string().trim().is_empty(),
                    "an empty problem for {text:?}"
                );
            }
        }
    }
}

/// The limits the request target runs under, small so they are reached.
const MAX_PROMPT_BYTES: u64 = 64;
const MAX_TOKENS: u32 = 32;
const MAX_STOP_STRINGS: u32 = 1;
const MAX_STOP_BYTES: u32 = 2;

fn request_config() -> Config {
    let mut config =
        match config::parse("[models.m]\ntp = 1\ncards = [0]\ncheckpoint = \"/m.gguf\"\n") {
            Ok(config) => config,
            Err(problems) => panic!("the fuzz config is invalid: {problems:?}"),
        };
    config.limits.max_prompt_bytes = MAX_PROMPT_BYTES;
    config.limits.max_tokens = Some(MAX_TOKENS);
    config.limits.max_stop_strings = MAX_STOP_STRINGS;
    config.limits.max_stop_bytes = MAX_STOP_BYTES;
    config
}

/// A `GenerateRequest` as a client may send it (any protobuf bytes):
/// validation never panics; what it accepts is within every rule and limit
/// (so nothing unchecked reaches a worker); what it refuses is NOT_FOUND or
/// INVALID_ARGUMENT with a message that starts with the field's name.
pub fn generate_request(data: &[u8]) {
    let Ok(request) = pb::GenerateRequest::decode(data) else {
        return;
    };
    check_request(&request_config(), &request);
}

fn check_request(config: &Config, request: &pb::GenerateRequest) {
    use crate::router::RouteError;
    match crate::router::validate_request(config, request) {
        Ok(()) => {
            assert!(config.models.contains_key(&request.model), "{request:?}");
            let prompt_bytes: usize = match &request.input {
                Some(pb::generate_request::Input::Prompt(p)) => p.len(),
                Some(pb::generate_request::Input::PromptTokens(t)) => {
                    assert!(!t.ids.is_empty(), "{request:?}");
                    t.ids.len() * 4
                }
                Some(pb::generate_request::Input::Chat(c)) => {
                    assert!(!c.messages.is_empty(), "{request:?}");
                    assert!(
                        c.messages
                            .iter()
                            .all(|m| crate::router::CHAT_ROLES.contains(&m.role.as_str())),
                        "{request:?}"
                    );
                    c.messages.iter().map(|m| m.content.len()).sum()
                }
                None => panic!("accepted without input: {request:?}"),
            };
            assert!(
                prompt_bytes as u64 <= config.limits.max_prompt_bytes,
                "{request:?}"
            );
            assert!(request.max_tokens <= MAX_TOKENS, "{request:?}");
            if let Some(s) = &request.sampling {
                assert!(
                    s.temperature.is_finite() && s.temperature >= 0.0,
                    "{request:?}"
                );
                assert!((0.0..=1.0).contains(&s.top_p), "{request:?}");
            }
            assert!(
                request.stop.len() <= config.limits.max_stop_strings as usize,
                "{request:?}"
            );
            assert!(request.n <= 1, "{request:?}");
            assert!(
                request.presence_penalty.is_finite()
                    && request.frequency_penalty.is_finite()
                    && request.repetition_penalty.is_finite(),
                "{request:?}"
            );
            assert!(
                request
                    .stop
                    .iter()
                    .all(|s| !s.is_empty() && s.len() <= config.limits.max_stop_bytes as usize),
                "{request:?}"
            );
        }
        Err(RouteError::UnknownModel(message)) => {
            assert!(message.starts_with("unknown model"), "{message}");
            // Client input is echoed bounded, never whole.
            assert!(message.len() < 512, "an unbounded echo: {message}");
        }
        Err(RouteError::Invalid(message)) => {
            let field = message.split(':').next().unwrap_or_default();
            assert!(
                !field.is_empty() && !field.contains(' '),
                "an invalid-request answer that does not start with the field: {message}"
            );
        }
        Err(other) => panic!("validation answered {other:?}"),
    }
}

fn round_trip(config: &Config) {
    let printed = match toml::to_string(config) {
        Ok(printed) => printed,
        Err(e) => panic!("an accepted config does not print as TOML: {e}\n{config:#?}"),
    };
    match config::parse(&printed) {
        Ok(again) => assert_eq!(
            &again, config,
            "printed config reads back differently:\n{printed}"
        ),
        Err(problems) => panic!("the printed config is refused: {problems:?}\n{printed}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small deterministic generator (xorshift), so the bounded run is
    /// the same on every machine.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }

        fn below(&mut self, n: usize) -> usize {
            (self.next() % n.max(1) as u64) as usize
        }
    }

    /// Bytes that matter to TOML and to our validation.
    const INTERESTING: &[&[u8]] = &[
        b"\"",
        b"'",
        b"[",
        b"]",
        b"[[",
        b"=",
        b"\n",
        b".",
        b",",
        b"{",
        b"}",
        b"#",
        b"0",
        b"-1",
        b"99999999999999999999",
        b"1e308",
        b"true",
        b"tp = 2",
        b"cards = [0, 0]",
        b"[models.x]\ntp = 1\ncards = [0]\ncheckpoint = \"/m\"\n",
        b"\\u0000",
        b"\xff",
        b"replicas = [[1], [2]]",
        b"0000:01:00.0",
    ];

    fn mutate(rng: &mut Rng, seed: &[u8]) -> Vec<u8> {
        let mut data = seed.to_vec();
        for _ in 0..=rng.below(4) {
            let at = rng.below(data.len() + 1);
            match rng.below(4) {
                0 => {
                    let piece = INTERESTING[rng.below(INTERESTING.len())];
                    data.splice(at..at, piece.iter().copied());
                }
                1 if !data.is_empty() => {
                    let end = (at + rng.below(16)).min(data.len());
                    data.drain(at.min(end)..end);
                }
                2 if at < data.len() => data[at] = rng.next() as u8,
                _ => data.truncate(at),
            }
        }
        data
    }

    fn seeds() -> Vec<Vec<u8>> {
        let mut seeds = vec![config::EXAMPLE_CONFIG.as_bytes().to_vec(), Vec::new()];
        let corpus =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus/config_parse");
        if let Ok(entries) = std::fs::read_dir(&corpus) {
            for entry in entries.flatten() {
                if let Ok(data) = std::fs::read(entry.path()) {
                    seeds.push(data);
                }
            }
        }
        seeds
    }

    #[test]
    fn the_example_and_the_corpus_hold_the_properties() {
        let seeds = seeds();
        assert!(seeds.len() > 3, "the checked-in corpus is missing");
        for seed in &seeds {
            config_text(seed);
        }
        let example = config::parse(config::EXAMPLE_CONFIG).expect("the example is valid");
        round_trip(&example);
    }

    /// The bounded stable run CI always does (the cargo-fuzz run needs a
    /// nightly toolchain): thousands of mutations of the seeds.
    fn arbitrary_request(rng: &mut Rng) -> pb::GenerateRequest {
        let text = |rng: &mut Rng, max: usize| -> String {
            let n = rng.below(max);
            (0..n)
                .map(|_| char::from(b'a' + rng.below(26) as u8))
                .collect()
        };
        let float = |rng: &mut Rng| -> f32 {
            [0.0, 0.7, 1.0, 1.5, -0.1, f32::NAN, f32::INFINITY, 2.0][rng.below(8)]
        };
        let json_fields = rng.below(16) == 0;
        pb::GenerateRequest {
            model: match rng.below(8) {
                0 => "x".repeat(65 + rng.below(1000)),
                1 => String::new(),
                2 => "other".to_string(),
                _ => "m".to_string(),
            },
            input: match rng.below(5) {
                0 => None,
                1 => Some(pb::generate_request::Input::Prompt(text(rng, 100))),
                2 => Some(pb::generate_request::Input::PromptTokens(
                    pb::PromptTokens {
                        ids: (0..rng.below(8)).map(|_| rng.below(1000) as u32).collect(),
                    },
                )),
                _ => Some(pb::generate_request::Input::Chat(pb::ChatMessages {
                    messages: (0..rng.below(4))
                        .map(|_| pb::ChatMessage {
                            role: ["user", "system", "assistant", "tool", ""][rng.below(5)].into(),
                            content: text(rng, 40),
                        })
                        .collect(),
                })),
            },
            max_tokens: [0, 1, 32, 33, u32::MAX][rng.below(5)],
            sampling: (rng.below(2) == 0).then(|| pb::SamplingParams {
                temperature: float(rng),
                top_p: float(rng),
                ..Default::default()
            }),
            stop: (0..rng.below(3)).map(|_| text(rng, 4)).collect(),
            presence_penalty: if rng.below(4) == 0 { float(rng) } else { 0.0 },
            frequency_penalty: if rng.below(4) == 0 { float(rng) } else { 0.0 },
            repetition_penalty: if rng.below(4) == 0 { float(rng) } else { 0.0 },
            min_tokens: [0, 0, 1, 40][rng.below(4)],
            ignore_eos: rng.below(4) == 0,
            stop_token_ids: (0..rng.below(2)).map(|_| rng.below(100) as u32).collect(),
            logprobs: [None, None, Some(0), Some(50)][rng.below(4)],
            prompt_logprobs: [None, None, None, Some(1)][rng.below(4)],
            prompt_only: rng.below(8) == 0,
            priority: 0,
            n: [0, 0, 1, 2][rng.below(4)],
            // The JSON-carrying fields, in one request of sixteen (each
            // refusal they reach is one acceptance fewer).
            response_format: json_fields
                .then(|| pb::ResponseFormat {
                    r#type: [1, 2, 2, 9][rng.below(4)],
                    name: ["s", ""][rng.below(2)].into(),
                    schema: ["{}", "{", "[]"][rng.below(3)].into(),
                    strict: true,
                })
                .filter(|_| rng.below(2) == 0),
            tools: if json_fields {
                [
                    "",
                    r#"[{"type":"function","function":{"name":"f"}}]"#,
                    "[",
                    "{}",
                ][rng.below(4)]
                .into()
            } else {
                String::new()
            },
            tool_choice: if json_fields {
                [
                    "",
                    r#""auto""#,
                    r#"{"type":"function","function":{"name":"g"}}"#,
                ][rng.below(3)]
                .into()
            } else {
                String::new()
            },
        }
    }

    /// Requests built field by field (to reach the checks), and raw bytes
    /// mutated from their encodings (to reach the decoder).
    #[test]
    fn requests_are_accepted_only_within_the_rules_and_refused_with_the_field() {
        let config = request_config();
        let mut rng = Rng(0x0dd_ba11_5eed_1234);
        let mut accepted = 0;
        for _ in 0..4000 {
            let request = arbitrary_request(&mut rng);
            if crate::router::validate_request(&config, &request).is_ok() {
                accepted += 1;
            }
            check_request(&config, &request);
            generate_request(&mutate(&mut rng, &request.encode_to_vec()));
        }
        assert!(
            accepted > 50,
            "the generator hardly reaches acceptance: {accepted}"
        );
    }

    #[test]
    fn mutated_configs_never_panic_and_round_trip_when_accepted() {
        let seeds = seeds();
        let mut rng = Rng(0x5eed_7e57_c0ff_ee11);
        for _ in 0..4000 {
            let seed = &seeds[rng.below(seeds.len())];
            config_text(&mutate(&mut rng, seed));
        }
    }
}
