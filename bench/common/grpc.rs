//! The public Inference service and a worker's Engine service as a gRPC
//! client sees them: one request shape and one reader of the answer.

use std::time::{Duration, Instant};
use tt_serving_proto::v1 as pb;

/// A greedy prompt request to model `m`; `ignore_eos` makes every answer
/// `tokens` long.
pub fn prompt_request(prompt: &str, tokens: u32, ignore_eos: bool) -> pb::GenerateRequest {
    pb::GenerateRequest {
        model: "m".into(),
        input: Some(pb::generate_request::Input::Prompt(prompt.into())),
        max_tokens: tokens,
        ignore_eos,
        ..Default::default()
    }
}

/// One streamed answer as its client saw it.
#[derive(Debug, Clone, Default)]
pub struct Answer {
    /// Token ids the deltas carried.
    pub delta_tokens: usize,
    /// `usage.completion_tokens` of the final chunk (0 without one).
    pub completion_tokens: u32,
    /// From `start` to the first delta with text.
    pub ttft: Option<Duration>,
    /// Between consecutive deltas.
    pub gaps: Vec<Duration>,
    /// From `start` to the end of the stream.
    pub total: Duration,
}

/// Read an answer to its end; `start` is when the request went out.
pub async fn read(mut stream: tonic::Streaming<pb::GenerateResponse>, start: Instant) -> Answer {
    let mut answer = Answer::default();
    let mut last = None;
    while let Some(chunk) = stream.message().await.expect("the gRPC answer stream") {
        match chunk.chunk {
            Some(pb::generate_response::Chunk::Delta(d)) => {
                let now = Instant::now();
                if !d.text.is_empty() {
                    answer.ttft.get_or_insert(now - start);
                }
                if let Some(prev) = last {
                    answer.gaps.push(now - prev);
                }
                last = Some(now);
                answer.delta_tokens += d.token_ids.len();
            }
            Some(pb::generate_response::Chunk::Final(f)) => {
                answer.completion_tokens = f.usage.map_or(0, |u| u.completion_tokens);
            }
            _ => {}
        }
    }
    answer.total = start.elapsed();
    answer
}

/// One request on the public Inference service at `channel`.
pub async fn generate(channel: tonic::transport::Channel, request: pb::GenerateRequest) -> Answer {
    let mut client = pb::inference_client::InferenceClient::new(channel);
    let start = Instant::now();
    let stream = client
        .generate(request)
        .await
        .expect("Inference.Generate")
        .into_inner();
    read(stream, start).await
}

/// A channel to the public port at `address` (`host:port`).
pub async fn connect(address: &str) -> tonic::transport::Channel {
    tonic::transport::Endpoint::from_shared(format!("http://{address}"))
        .expect("an address")
        .connect()
        .await
        .unwrap_or_else(|e| panic!("the inference port at {address}: {e}"))
}
