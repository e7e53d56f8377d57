//! `ttctl generate`: one generation through the daemon's router, printed as
//! it streams.

use std::io::Write;

use tt_serving_proto::v1::generate_request::Input;
use tt_serving_proto::v1::generate_response::Chunk;
use tt_serving_proto::v1::{
    ChatMessage, ChatMessages, FinishReason, GenerateRequest, SamplingParams,
};

use super::args::GenerateArgs;
use super::client::Daemon;
use super::outcome::{emit, note, Failure};
use super::render::generate_summary;

/// The request `args` describe. Sampling settings are sent only when one is
/// given; none means greedy decoding, the daemon's default.
pub(super) fn request(args: &GenerateArgs, prompt: String) -> GenerateRequest {
    let input = if args.chat {
        Input::Chat(ChatMessages {
            messages: vec![ChatMessage {
                role: "user".to_string(),
                content: prompt,
            }],
        })
    } else {
        Input::Prompt(prompt)
    };
    let sampled = args.temperature.is_some()
        || args.top_p.is_some()
        || args.top_k.is_some()
        || args.seed.is_some();
    GenerateRequest {
        model: args.model.clone(),
        input: Some(input),
        max_tokens: args.max_tokens,
        sampling: sampled.then(|| SamplingParams {
            temperature: args.temperature.unwrap_or(0.0),
            top_p: args.top_p.unwrap_or(0.0),
            top_k: args.top_k.unwrap_or(0),
            seed: args.seed,
        }),
        stop: args.stop.clone(),
        ignore_eos: args.ignore_eos,
        min_tokens: args.min_tokens.unwrap_or(0),
        presence_penalty: args.presence_penalty.unwrap_or(0.0),
        frequency_penalty: args.frequency_penalty.unwrap_or(0.0),
        repetition_penalty: args.repetition_penalty.unwrap_or(0.0),
        stop_token_ids: args.stop_token_id.clone(),
        priority: args.priority,
        ..Default::default()
    }
}

/// The prompt as given: on the command line, or read from `--prompt-file`
/// or from `stdin` (`-` as either). Bytes that are not UTF-8 are refused
/// naming where they came from, rather than sent altered.
pub(super) fn prompt_text(
    args: &GenerateArgs,
    stdin: &mut dyn std::io::Read,
) -> Result<String, Failure> {
    let from_stdin = |stdin: &mut dyn std::io::Read| -> Result<String, Failure> {
        let mut bytes = Vec::new();
        stdin.read_to_end(&mut bytes).map_err(|e| {
            Failure::Failed(format!("cannot read the prompt from standard input: {e}"))
        })?;
        String::from_utf8(bytes).map_err(|e| {
            Failure::Failed(format!(
                "the prompt on standard input is not UTF-8 (byte {}); convert it first (iconv)",
                e.utf8_error().valid_up_to()
            ))
        })
    };
    match (&args.prompt, &args.prompt_file) {
        (Some(p), None) if p == "-" => from_stdin(stdin),
        (Some(p), None) => Ok(p.clone()),
        (None, Some(path)) if path.as_os_str() == "-" => from_stdin(stdin),
        (None, Some(path)) => {
            let bytes = std::fs::read(path).map_err(|e| {
                Failure::Failed(format!(
                    "cannot read the prompt file {}: {e}",
                    path.display()
                ))
            })?;
            String::from_utf8(bytes).map_err(|e| {
                Failure::Failed(format!(
                    "the prompt file {} is not UTF-8 (byte {}); convert it first (iconv)",
                    path.display(),
                    e.utf8_error().valid_up_to()
                ))
            })
        }
        // clap requires exactly one of them.
        _ => Err(Failure::Failed(
            "give the prompt as PROMPT, `-` (standard input) or --prompt-file PATH".into(),
        )),
    }
}

/// Stream the text to `out` as it arrives (flushed per delta, so a person
/// watches it being written), end it with a newline, then put the summary
/// from the final chunk on `err`. The parameters are checked by the daemon,
/// whose refusals (unknown model, no ready slot, full queue, bad values)
/// come back as the failure message, exit 1.
pub(super) async fn run(
    daemon: &mut Daemon,
    args: &GenerateArgs,
    out: &mut (dyn Write + Send),
    err: &mut (dyn Write + Send),
) -> Result<(), Failure> {
    let prompt = prompt_text(args, &mut std::io::stdin().lock())?;
    let mut stream = daemon.generate(request(args, prompt)).await?;
    // Whether what was printed so far ends a line; nothing printed does not,
    // so even an empty answer prints the final newline.
    let mut at_line_start = false;
    loop {
        let next = match stream.next().await {
            Ok(next) => next,
            Err(failure) => {
                // Partial text stays printed; end its line so the error
                // does not run into it on a terminal.
                end_line(out, at_line_start);
                return Err(failure);
            }
        };
        match next.and_then(|response| response.chunk) {
            Some(Chunk::Delta(delta)) => {
                if !delta.text.is_empty() {
                    emit(out, &delta.text)?;
                    at_line_start = delta.text.ends_with('\n');
                }
            }
            Some(Chunk::Final(done)) => {
                if !at_line_start {
                    emit(out, "\n")?;
                }
                note(err, &format!("{}\n", generate_summary(&done)));
                if done.finish_reason == FinishReason::Cancelled as i32 {
                    return Err(Failure::Failed(format!(
                        "the generation was cancelled before it finished (slot {} is \
                         draining or restarting; see 'ttctl status')",
                        if done.slot.is_empty() {
                            "?"
                        } else {
                            &done.slot
                        }
                    )));
                }
                return Ok(());
            }
            // Not asked for by `ttctl generate`.
            Some(Chunk::PromptLogprobs(_)) => {}
            None => {
                end_line(out, at_line_start);
                return Err(Failure::Failed(format!(
                    "tt-servingd ended the generation without its final chunk, so the text \
                     above may be cut short (check 'ttctl status' and 'ttctl logs' for the \
                     slots of {})",
                    args.model
                )));
            }
        }
    }
}

/// Finish a partly printed line before reporting a failure. If stdout is
/// gone there is nothing to finish.
fn end_line(out: &mut (dyn Write + Send), at_line_start: bool) {
    if !at_line_start {
        let _ = emit(out, "\n");
    }
}
