//! The zero-cost engine: vLLM's OpenAI surface as far as `tt-worker-openai
//! --engine vllm` uses it (`/health`, `/version`, `/v1/models`, streamed
//! `/v1/completions` and `/v1/chat/completions` in vLLM 0.32's chunk shape,
//! `token_ids` when asked with `return_token_ids`), answering with no model
//! at all, so the relay's own cost and ceiling show. One SSE event per
//! token, each its own body frame; `--token-us` paces them (0: as fast as
//! the client reads).

use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Bytes, Frame, Incoming};
use hyper::{Request, Response, StatusCode};
use serde_json::{json, Value};
use std::convert::Infallible;
use std::time::Duration;
use tokio_stream::wrappers::ReceiverStream;

type Body = http_body_util::combinators::BoxBody<Bytes, Infallible>;

pub struct Options {
    pub host: String,
    pub port: u16,
    pub model: String,
    pub token_us: u64,
}

fn full(status: StatusCode, body: String) -> Response<Body> {
    let mut r = Response::new(Full::new(Bytes::from(body)).boxed());
    *r.status_mut() = status;
    r
}

/// Serves until killed.
pub async fn serve(opts: Options) -> std::io::Result<()> {
    // vLLM's server asks the kernel for a backlog of 2048 (uvicorn 0.55
    // `Config.backlog`); tokio's bind asks 128, which a thousand clients
    // connecting at once overflow into 1 s SYN retransmits.
    let listener = tt_servingd::listen::bind(&format!("{}:{}", opts.host, opts.port), 2048).await?;
    eprintln!(
        "fast engine: serving {} on {}:{}",
        opts.model, opts.host, opts.port
    );
    let opts = std::sync::Arc::new(opts);
    loop {
        let (stream, _) = listener.accept().await?;
        let _ = stream.set_nodelay(true);
        let opts = opts.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| handle(req, opts.clone()));
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                .await;
        });
    }
}

async fn handle(
    req: Request<Incoming>,
    opts: std::sync::Arc<Options>,
) -> Result<Response<Body>, Infallible> {
    let path = req.uri().path().to_string();
    Ok(match (req.method().as_str(), path.as_str()) {
        ("GET", "/health") => full(StatusCode::OK, String::new()),
        ("GET", "/version") => full(StatusCode::OK, json!({"version": "0.0.0+fast"}).to_string()),
        ("GET", "/v1/models") => full(
            StatusCode::OK,
            json!({"object": "list", "data": [{"id": opts.model, "object": "model", "max_model_len": 1_000_000}]})
                .to_string(),
        ),
        ("POST", "/v1/completions") | ("POST", "/v1/chat/completions") => {
            let chat = path == "/v1/chat/completions";
            let body = match req.into_body().collect().await {
                Ok(b) => b.to_bytes(),
                Err(e) => return Ok(full(StatusCode::BAD_REQUEST, e.to_string())),
            };
            let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            stream(&opts, chat, &body)
        }
        _ => full(StatusCode::NOT_FOUND, json!({"detail": "Not Found"}).to_string()),
    })
}

fn stream(opts: &Options, chat: bool, body: &Value) -> Response<Body> {
    let tokens = body["max_tokens"].as_u64().unwrap_or(16);
    let ids = body["return_token_ids"].as_bool().unwrap_or(false);
    let usage = body["stream_options"]["include_usage"]
        .as_bool()
        .unwrap_or(false);
    let (object, id) = if chat {
        ("chat.completion.chunk", "chatcmpl-fast")
    } else {
        ("text_completion", "cmpl-fast")
    };
    let (model, pace) = (opts.model.clone(), Duration::from_micros(opts.token_us));
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, Infallible>>(4);
    tokio::spawn(async move {
        let event = |choice: Value, usage: Value| {
            let chunk = json!({"id": id, "object": object, "created": 0, "model": model,
                "choices": choice, "usage": usage});
            Ok(Frame::data(Bytes::from(format!("data: {chunk}\n\n"))))
        };
        let choice = |i: u64, text: &str, finish: Value| {
            let mut c = if chat {
                json!({"index": 0, "delta": {"content": text}, "logprobs": null, "finish_reason": finish})
            } else {
                json!({"index": 0, "text": text, "logprobs": null, "finish_reason": finish, "stop_reason": null})
            };
            if ids {
                c["token_ids"] = if text.is_empty() {
                    json!([])
                } else {
                    json!([1000 + i % 1000])
                };
            }
            json!([c])
        };
        for i in 0..tokens {
            if !pace.is_zero() {
                tokio::time::sleep(pace).await;
            }
            let finish = if i + 1 == tokens {
                json!("length")
            } else {
                Value::Null
            };
            if tx
                .send(event(choice(i, " w", finish), Value::Null))
                .await
                .is_err()
            {
                return;
            }
        }
        if usage {
            let u = json!({"prompt_tokens": 8, "completion_tokens": tokens, "total_tokens": tokens + 8});
            let _ = tx.send(event(json!([]), u)).await;
        }
        let _ = tx
            .send(Ok(Frame::data(Bytes::from_static(b"data: [DONE]\n\n"))))
            .await;
    });
    let mut r = Response::new(BodyExt::boxed(StreamBody::new(ReceiverStream::new(rx))));
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("text/event-stream; charset=utf-8"),
    );
    r
}
