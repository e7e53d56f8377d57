//! Oversize request messages get the limits answer, not a decoder error.
//!
//! tonic refuses a message longer than `max_decoding_message_size` with
//! OUT_OF_RANGE "decoded message length too large", which tells a client
//! neither the limit nor the fix. [`MessageLimit`] wraps a service's request
//! body and reads the 5-byte gRPC prefix of each message (flag, then length,
//! big-endian) as the bytes pass: a message declared longer than the limit
//! ends the body with an INVALID_ARGUMENT `Status` naming
//! `limits.max_prompt_bytes`, which tonic's decoder hands to the client as
//! it is. Nothing is buffered here, and the message is refused from its
//! prefix, before its bytes arrive, so memory stays bounded by the limit.
//! A refused Generate on the public port counts under its key (`invalid`,
//! model `""`), as the router counts its own refusals.

use crate::usage::KeyName;
use hyper::body::{Body, Bytes, Frame, SizeHint};
use std::pin::Pin;
use std::task::{Context, Poll};
use tonic::Status;

/// The gRPC length prefix: one flag byte, four length bytes.
const PREFIX: usize = 5;

/// How far the message may exceed the prompt limit: room for the model
/// name, stop strings, sampling settings and the chat messages' framing.
pub const OTHER_FIELDS_BYTES: usize = 1024 * 1024;

/// The largest request message accepted when prompts may have
/// `max_prompt_bytes`.
pub fn max_message_bytes(max_prompt_bytes: u64) -> usize {
    usize::try_from(max_prompt_bytes)
        .unwrap_or(usize::MAX)
        .saturating_add(OTHER_FIELDS_BYTES)
}

/// A service whose request messages are held to a size limit.
#[derive(Debug, Clone)]
pub struct MessageLimit<S> {
    inner: S,
    max_prompt_bytes: u64,
}

impl<S> MessageLimit<S> {
    /// Wrap `inner`; its messages may be up to
    /// [`max_message_bytes`]`(max_prompt_bytes)` long.
    pub fn new(inner: S, max_prompt_bytes: u64) -> Self {
        MessageLimit {
            inner,
            max_prompt_bytes,
        }
    }
}

impl<S: tonic::server::NamedService> tonic::server::NamedService for MessageLimit<S> {
    const NAME: &'static str = S::NAME;
}

impl<S> tower::Service<hyper::Request<tonic::body::Body>> for MessageLimit<S>
where
    S: tower::Service<hyper::Request<tonic::body::Body>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: hyper::Request<tonic::body::Body>) -> Self::Future {
        let max_prompt_bytes = self.max_prompt_bytes;
        // A Generate whose key the public port's token check named is
        // counted under it when refused here; the control socket checks
        // its caller only after the message is read, so nothing is known
        // to count its refusals under.
        let count = request
            .uri()
            .path()
            .ends_with("/Generate")
            .then(|| request.extensions().get::<KeyName>().cloned())
            .flatten();
        self.inner.call(request.map(|body| {
            tonic::body::Body::new(LimitedBody {
                inner: body,
                framing: Framing::new(max_prompt_bytes),
                count,
            })
        }))
    }
}

/// Reads message prefixes as the body passes; the first message over the
/// limit turns into an error and ends the body.
struct LimitedBody {
    inner: tonic::body::Body,
    framing: Framing,
    /// The key a refusal counts under (usage per key, `invalid`, model
    /// `""`: the message is not read), taken when counted.
    count: Option<KeyName>,
}

impl Body for LimitedBody {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        if self.framing.refused {
            return Poll::Ready(None);
        }
        let frame = match Pin::new(&mut self.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => frame,
            other => return other,
        };
        if let Some(data) = frame.data_ref() {
            if let Err(status) = self.framing.feed(data) {
                if let Some(key) = self.count.take() {
                    crate::usage::request(&key, "", crate::router::Outcome::Invalid.label());
                }
                return Poll::Ready(Some(Err(status)));
            }
        }
        Poll::Ready(Some(Ok(frame)))
    }

    fn is_end_stream(&self) -> bool {
        self.framing.refused || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Where the body is in its sequence of length-prefixed messages.
#[derive(Debug)]
struct Framing {
    max_prompt_bytes: u64,
    max: usize,
    /// The prefix of the next message, as far as it has arrived.
    prefix: [u8; PREFIX],
    have: usize,
    /// Bytes of the current message still to pass.
    rest: usize,
    /// A message was refused; the body is over.
    refused: bool,
}

impl Framing {
    fn new(max_prompt_bytes: u64) -> Framing {
        Framing {
            max_prompt_bytes,
            max: max_message_bytes(max_prompt_bytes),
            prefix: [0; PREFIX],
            have: 0,
            rest: 0,
            refused: false,
        }
    }

    /// Account for the next bytes of the body.
    fn feed(&mut self, mut data: &[u8]) -> Result<(), Status> {
        while !data.is_empty() {
            if self.rest > 0 {
                let n = self.rest.min(data.len());
                self.rest -= n;
                data = &data[n..];
                continue;
            }
            let n = (PREFIX - self.have).min(data.len());
            self.prefix[self.have..self.have + n].copy_from_slice(&data[..n]);
            self.have += n;
            data = &data[n..];
            if self.have == PREFIX {
                self.have = 0;
                let [_, a, b, c, d] = self.prefix;
                let len = u32::from_be_bytes([a, b, c, d]) as usize;
                if len > self.max {
                    self.refused = true;
                    return Err(self.refusal(len));
                }
                self.rest = len;
            }
        }
        Ok(())
    }

    /// Worded like the router's prompt check (`router::check_prompt_size`):
    /// the prompt is what makes a request this big.
    fn refusal(&self, len: usize) -> Status {
        Status::invalid_argument(format!(
            "prompt: the request is {len} bytes, more than any prompt within this server's limit of {} bytes (limits.max_prompt_bytes) needs (requests may have {} bytes in all); shorten the prompt or the chat messages",
            self.max_prompt_bytes, self.max
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(len: usize) -> Vec<u8> {
        let mut m = vec![0u8];
        m.extend_from_slice(&(len as u32).to_be_bytes());
        m.extend(std::iter::repeat_n(b'x', len));
        m
    }

    #[test]
    fn messages_within_the_limit_pass_however_they_are_split() {
        let mut body = message(10);
        body.extend(message(0));
        body.extend(message(1024 + OTHER_FIELDS_BYTES));
        for chunk in [1, 3, 5, 7, 4096, body.len()] {
            let mut framing = Framing::new(1024);
            for piece in body.chunks(chunk) {
                framing.feed(piece).expect("within the limit");
            }
            assert_eq!((framing.have, framing.rest), (0, 0), "chunk {chunk}");
        }
    }

    #[test]
    fn an_oversize_message_is_refused_from_its_prefix_with_the_limit_and_the_fix() {
        let mut framing = Framing::new(1024);
        framing.feed(&message(3)).unwrap();
        // Only the prefix of the big message has arrived.
        let big = 1025 + OTHER_FIELDS_BYTES;
        let mut prefix = vec![0u8];
        prefix.extend_from_slice(&(big as u32).to_be_bytes());
        framing.feed(&prefix[..2]).unwrap();
        let err = framing.feed(&prefix[2..]).unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument);
        let text = err.message();
        assert!(
            text.starts_with(&format!("prompt: the request is {big} bytes")),
            "{text}"
        );
        assert!(
            text.contains("limit of 1024 bytes (limits.max_prompt_bytes)"),
            "{text}"
        );
        assert!(text.contains("shorten the prompt"), "{text}");
        assert!(framing.refused);
    }
}
