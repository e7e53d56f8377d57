//! Readiness: the engine is ready once its health path answers 200 and
//! `/v1/models` lists a model. Then the context length (vLLM: the model's
//! `max_model_len`; llama-server: `/props` `n_ctx`) and the engine's
//! version are read for `Info`.

use crate::cli::EngineKind;
use crate::http;
use crate::openai;
use crate::status::Loaded;
use std::time::{Duration, Instant};

/// How long one probe request may take. A loading vLLM does not listen yet
/// (connection refused at once); a loading llama-server answers 503 at once.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// Asks the engine whether it is ready.
#[derive(Debug, Clone)]
pub struct Probe {
    /// Engine kind.
    pub kind: EngineKind,
    /// Engine port.
    pub port: u16,
    /// Health path.
    pub health_path: String,
    /// When the engine was started.
    pub started: Instant,
}

impl Probe {
    /// One look: `Some` once ready.
    pub async fn once(&self) -> Option<Loaded> {
        let (code, _) = http::get(self.port, &self.health_path, PROBE_TIMEOUT)
            .await
            .ok()?;
        if code != hyper::StatusCode::OK {
            return None;
        }
        let (code, body) = http::get(self.port, "/v1/models", PROBE_TIMEOUT)
            .await
            .ok()?;
        if code != hyper::StatusCode::OK {
            return None;
        }
        let model = openai::first_model(&body)?;
        let (context, version, template_calls_tools) = match self.kind {
            EngineKind::Vllm | EngineKind::VllmTt => {
                let version = self
                    .read("/version")
                    .await
                    .and_then(|b| openai::version(&b));
                (model.max_model_len, version, None)
            }
            EngineKind::LlamaServer => match self.read("/props").await {
                Some(props) => (
                    openai::props_context(&props),
                    openai::version(&props),
                    openai::template_calls_tools(&props),
                ),
                None => (None, None, None),
            },
        };
        if context.is_none() {
            tracing::warn!(
                engine = self.kind.name(),
                "the engine did not say its context length; Info reports 0"
            );
        }
        // vLLM describes its KV cache in its metrics; llama-server does not.
        let kv_cache = match self.kind {
            EngineKind::Vllm | EngineKind::VllmTt => self
                .read("/metrics")
                .await
                .and_then(|m| crate::metrics::vllm_kv_cache(&m)),
            EngineKind::LlamaServer => None,
        };
        Some(Loaded {
            model: model.id,
            context_length: context.unwrap_or(0),
            parameters: model.parameters.unwrap_or(0),
            engine_version: version,
            load_time: self.started.elapsed(),
            kv_cache,
            template_calls_tools,
        })
    }

    async fn read(&self, path: &str) -> Option<String> {
        match http::get(self.port, path, PROBE_TIMEOUT).await {
            Ok((code, body)) if code.is_success() => Some(body),
            _ => None,
        }
    }
}
