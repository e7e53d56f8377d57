//! One generation on a worker that is not yet routed to (the readiness
//! ping, the warm-up, the accuracy check), read to its final chunk.

use tonic::transport::Channel;
use tt_serving_proto::v1 as pb;
use tt_serving_proto::v1::engine_client::EngineClient;

/// The text `request` produced and its usage, or why it failed.
pub(super) async fn complete(
    engine: &mut EngineClient<Channel>,
    request: pb::EngineGenerateRequest,
) -> Result<(String, Option<pb::Usage>), String> {
    let mut stream = engine
        .generate(request)
        .await
        .map_err(|s| s.message().to_string())?
        .into_inner();
    let mut text = String::new();
    let mut finished = None;
    while let Some(chunk) = stream
        .message()
        .await
        .map_err(|s| s.message().to_string())?
    {
        match chunk.chunk {
            Some(pb::generate_response::Chunk::Delta(d)) => text.push_str(&d.text),
            Some(pb::generate_response::Chunk::Final(f)) => finished = Some(f.usage),
            Some(pb::generate_response::Chunk::PromptLogprobs(_)) | None => {}
        }
    }
    match finished {
        Some(usage) => Ok((text, usage)),
        None => Err("the stream ended without a final chunk".into()),
    }
}
