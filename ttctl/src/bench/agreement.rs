//! Greedy agreement between A/B arms: the same fixed prompts answered
//! greedily by each arm, compared token by token.
//!
//! A numerics change (a dtype, a fused kernel, a cache trick) shows here
//! before it shows in a task score: the first token where two arms part,
//! and how far the chosen tokens' log-probabilities moved before that.

use serde::Serialize;
use serde_json::{json, Value};
use tt_serving_proto::v1::generate_request::Input;
use tt_serving_proto::v1::generate_response::Chunk;
use tt_serving_proto::v1::GenerateRequest;

use super::super::client::Daemon;

/// Tokens generated per prompt.
pub const TOKENS: u32 = 32;

/// The fixed prompts: plain continuations (no chat template, so any
/// engine reads them alike), facts and prose a small model continues with
/// confidence and a few where it hesitates, which part first.
pub const PROMPTS: [&str; 8] = [
    "The capital of France is",
    "Water boils at a temperature of",
    "Once upon a time, in a small village by the sea,",
    "The three primary colors are",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "The largest planet in our solar system is",
    "To make a cup of tea, first",
    "In 1969, the first person to walk on the Moon was",
];

/// One arm's greedy answer to one prompt.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Answer {
    /// The generated token ids (empty when the engine sends none).
    pub tokens: Vec<u32>,
    /// The chosen tokens' log-probabilities, one per token, when the engine
    /// returned them.
    pub logprobs: Vec<f32>,
    /// The text.
    pub text: String,
}

/// Each prompt of [`PROMPTS`] answered greedily through the router. Asks
/// for the chosen tokens' log-probabilities, and again without them when
/// the engine refuses `logprobs` by name.
pub async fn answers(daemon: &mut Daemon, model: &str) -> Result<Vec<Answer>, String> {
    let mut with_logprobs = true;
    let mut out = Vec::with_capacity(PROMPTS.len());
    for prompt in PROMPTS {
        let request = |logprobs: bool| GenerateRequest {
            model: model.to_string(),
            input: Some(Input::Prompt(prompt.to_string())),
            max_tokens: TOKENS,
            logprobs: logprobs.then_some(0),
            ..Default::default()
        };
        let answer = match answer(daemon, request(with_logprobs)).await {
            Err(why) if with_logprobs && why.contains("logprobs") => {
                with_logprobs = false;
                answer(daemon, request(false)).await
            }
            other => other,
        };
        out.push(answer.map_err(|why| format!("greedy answer to {prompt:?}: {why}"))?);
    }
    Ok(out)
}

/// One generation read to its final chunk: its text, ids and logprobs.
pub(crate) async fn answer(
    daemon: &mut Daemon,
    request: GenerateRequest,
) -> Result<Answer, String> {
    let mut stream = daemon
        .generate(request)
        .await
        .map_err(|f| f.message().to_string())?;
    let mut a = Answer::default();
    loop {
        match stream.next().await.map_err(|f| f.message().to_string())? {
            Some(r) => match r.chunk {
                Some(Chunk::Delta(d)) => {
                    a.text.push_str(&d.text);
                    a.tokens.extend(&d.token_ids);
                    a.logprobs.extend(d.logprobs.iter().map(|l| l.logprob));
                }
                Some(Chunk::Final(_)) => return Ok(a),
                _ => {}
            },
            None => return Err("the stream ended without its final chunk".into()),
        }
    }
}

/// How far `cand`'s answers agree with `base`'s, prompt by prompt:
/// `identical_share` (tokens equal at the same position, over the longer
/// answer's length, summed over prompts), `first_divergence` (per prompt,
/// the first position where they differ, null when they never do), and
/// `mean_abs_logprob_diff` (the chosen tokens' |Δ log-probability| before
/// each prompt's divergence; null when an arm returned none, `logprobs`
/// false, or no prompt had a token before parting). Token ids
/// are compared where both arms sent them for every token, else the
/// texts' characters (`unit` says which).
pub fn compare(base: &[Answer], cand: &[Answer]) -> Value {
    let by_tokens = base
        .iter()
        .chain(cand)
        .all(|a| !a.tokens.is_empty() || a.text.is_empty());
    let units = |a: &Answer| -> Vec<u32> {
        if by_tokens {
            a.tokens.clone()
        } else {
            a.text.chars().map(u32::from).collect()
        }
    };
    let (mut identical, mut compared) = (0usize, 0usize);
    let (mut diff_sum, mut diff_n) = (0f64, 0usize);
    let mut divergence = Vec::with_capacity(base.len());
    for (b, c) in base.iter().zip(cand) {
        let (bu, cu) = (units(b), units(c));
        let same = bu.iter().zip(&cu).take_while(|(x, y)| x == y).count();
        let diverged = same < bu.len().max(cu.len());
        identical += bu.iter().zip(&cu).filter(|(x, y)| x == y).count();
        compared += bu.len().max(cu.len());
        divergence.push(diverged.then_some(same));
        if by_tokens && b.logprobs.len() == b.tokens.len() && c.logprobs.len() == c.tokens.len() {
            for (x, y) in b.logprobs.iter().zip(&c.logprobs).take(same) {
                diff_sum += f64::from((x - y).abs());
                diff_n += 1;
            }
        }
    }
    let diverged = divergence.iter().filter(|d| d.is_some()).count();
    let share = if compared == 0 {
        1.0
    } else {
        identical as f64 / compared as f64
    };
    let logprobs_returned = by_tokens
        && base
            .iter()
            .chain(cand)
            .all(|a| a.logprobs.len() == a.tokens.len() && !a.tokens.is_empty());
    json!({
        "prompts": base.len().min(cand.len()),
        "tokens_per_prompt": TOKENS,
        "unit": if by_tokens { "tokens" } else { "characters" },
        "identical_share": (share * 1000.0).round() / 1000.0,
        "prompts_diverged": diverged,
        "first_divergence": divergence,
        "logprobs": logprobs_returned,
        "mean_abs_logprob_diff": (logprobs_returned && diff_n > 0)
            .then(|| (diff_sum / diff_n as f64 * 1e4).round() / 1e4),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(tokens: &[u32], logprobs: &[f32]) -> Answer {
        Answer {
            tokens: tokens.to_vec(),
            logprobs: logprobs.to_vec(),
            text: tokens.iter().map(|t| format!("<{t}>")).collect(),
        }
    }

    #[test]
    fn identical_answers_agree_fully() {
        let base = [
            a(&[1, 2, 3], &[-0.1, -0.2, -0.3]),
            a(&[4, 5], &[-1.0, -1.0]),
        ];
        let c = compare(&base, &base);
        assert_eq!(c["identical_share"], 1.0);
        assert_eq!(c["prompts_diverged"], 0);
        assert_eq!(c["first_divergence"], json!([null, null]));
        assert_eq!(c["mean_abs_logprob_diff"], 0.0);
        assert_eq!(c["unit"], "tokens");
    }

    #[test]
    fn divergence_is_where_they_part_and_logprobs_count_before_it() {
        let base = [
            a(&[1, 2, 3, 4], &[-0.1, -0.2, -0.3, -0.4]),
            a(&[7], &[-1.0]),
        ];
        let cand = [
            a(&[1, 2, 9, 4], &[-0.2, -0.4, -0.3, -0.4]),
            a(&[7, 8], &[-1.0, -0.5]),
        ];
        let c = compare(&base, &cand);
        // 3 of 4 equal in the first, 1 of 2 (the longer) in the second.
        assert_eq!(c["identical_share"], 0.667);
        assert_eq!(c["first_divergence"], json!([2, 1]));
        assert_eq!(c["prompts_diverged"], 2);
        // Before divergence: |0.1|, |0.2| in the first, 0 in the second.
        assert_eq!(c["mean_abs_logprob_diff"], 0.1);
    }

    #[test]
    fn without_token_ids_the_texts_are_compared_and_no_logprob_difference_is_claimed() {
        let text = |t: &str| Answer {
            text: t.into(),
            ..Default::default()
        };
        let c = compare(&[text("Paris.")], &[text("Paris!")]);
        assert_eq!(c["unit"], "characters");
        assert_eq!(c["first_divergence"], json!([5]));
        assert_eq!(c["mean_abs_logprob_diff"], Value::Null);
    }
}
