//! The two endpoints: where a request goes, and what its answers are
//! called.

/// `/v1/completions` or `/v1/chat/completions`; their chunks differ in
/// where the text is (`choices[0].text`, `choices[0].delta.content`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// `/v1/completions`: a prompt, answered in `choices[0].text`.
    Completions,
    /// `/v1/chat/completions`: messages, answered in
    /// `choices[0].delta.content` (streamed) or `choices[0].message`.
    Chat,
}

impl Endpoint {
    /// The path.
    pub fn path(self) -> &'static str {
        match self {
            Endpoint::Completions => "/v1/completions",
            Endpoint::Chat => "/v1/chat/completions",
        }
    }

    /// The name of a request's span (OpenTelemetry's HTTP convention:
    /// method and route).
    pub fn span_name(self) -> &'static str {
        match self {
            Endpoint::Completions => "POST /v1/completions",
            Endpoint::Chat => "POST /v1/chat/completions",
        }
    }

    /// An answer's `object`, streamed (a chunk) or collected.
    pub fn object(self, streamed: bool) -> &'static str {
        match (self, streamed) {
            (Endpoint::Completions, _) => "text_completion",
            (Endpoint::Chat, false) => "chat.completion",
            (Endpoint::Chat, true) => "chat.completion.chunk",
        }
    }

    /// The prefix of an answer's `id`.
    pub fn id_prefix(self) -> &'static str {
        match self {
            Endpoint::Completions => "cmpl",
            Endpoint::Chat => "chatcmpl",
        }
    }
}
