//! The optional `GenerateRequest` parameters: the names an engine lists in
//! `InfoResponse.supported_parameters`, and which of them a request asks
//! for. The daemon refuses a request asking for one its engine does not
//! list, so both sides read "asked for" from this one function.

use crate::v1::GenerateRequest;

/// `presence_penalty`.
pub const PRESENCE_PENALTY: &str = "presence_penalty";
/// `frequency_penalty`.
pub const FREQUENCY_PENALTY: &str = "frequency_penalty";
/// `repetition_penalty`.
pub const REPETITION_PENALTY: &str = "repetition_penalty";
/// `min_tokens`.
pub const MIN_TOKENS: &str = "min_tokens";
/// `ignore_eos`.
pub const IGNORE_EOS: &str = "ignore_eos";
/// `stop_token_ids`.
pub const STOP_TOKEN_IDS: &str = "stop_token_ids";
/// `logprobs`.
pub const LOGPROBS: &str = "logprobs";

/// Every optional parameter, in field order (the names are the proto
/// field names).
pub const OPTIONAL_PARAMETERS: [&str; 7] = [
    PRESENCE_PENALTY,
    FREQUENCY_PENALTY,
    REPETITION_PENALTY,
    MIN_TOKENS,
    IGNORE_EOS,
    STOP_TOKEN_IDS,
    LOGPROBS,
];

/// The optional parameters `request` asks for, in field order. A value
/// that means "off" is not asking: 0 for the penalties, min_tokens and
/// ignore_eos, also 1 for `repetition_penalty`, an empty `stop_token_ids`
/// and an absent `logprobs` (a NaN penalty is asking, so that it reaches
/// a check that refuses it).
pub fn requested(request: &GenerateRequest) -> Vec<&'static str> {
    let mut asked = Vec::new();
    let mut ask = |on: bool, name: &'static str| {
        if on {
            asked.push(name);
        }
    };
    ask(request.presence_penalty != 0.0, PRESENCE_PENALTY);
    ask(request.frequency_penalty != 0.0, FREQUENCY_PENALTY);
    ask(
        request.repetition_penalty != 0.0 && request.repetition_penalty != 1.0,
        REPETITION_PENALTY,
    );
    ask(request.min_tokens != 0, MIN_TOKENS);
    ask(request.ignore_eos, IGNORE_EOS);
    ask(!request.stop_token_ids.is_empty(), STOP_TOKEN_IDS);
    ask(request.logprobs.is_some(), LOGPROBS);
    asked
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn off_values_ask_for_nothing_and_each_field_names_itself() {
        assert!(requested(&GenerateRequest::default()).is_empty());
        let off = GenerateRequest {
            repetition_penalty: 1.0,
            n: 1,
            ..Default::default()
        };
        assert!(requested(&off).is_empty());
        let all = GenerateRequest {
            presence_penalty: 0.5,
            frequency_penalty: -0.5,
            repetition_penalty: f32::NAN,
            min_tokens: 3,
            ignore_eos: true,
            stop_token_ids: vec![2],
            logprobs: Some(0),
            ..Default::default()
        };
        assert_eq!(requested(&all), OPTIONAL_PARAMETERS.to_vec());
    }
}
