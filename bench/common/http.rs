//! The OpenAI door as a client sees it: JSON posts, GETs, and the
//! server-sent events of a streamed answer.

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;

/// An HTTP/1 client over plain TCP.
pub type HttpClient = Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>;

/// How a request uses connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Connection {
    /// `connection: close`, a new connection each: a pooled connection that
    /// llama-server closed while idle fails the next request that picks it
    /// up, and a loopback connect costs every arm the same ~0.1 ms.
    Close,
    /// Pooled (the CPU benchmark: no accept per request in the servers'
    /// figures); a pooled connection the server closed meanwhile is retried
    /// on a new one, up to three times.
    Pooled,
}

/// A client with hyper's default pool (what [`Connection::Close`]
/// requests use).
pub fn client() -> HttpClient {
    Client::builder(TokioExecutor::new()).build_http()
}

/// A client keeping up to `idle` connections per host for
/// [`Connection::Pooled`] requests.
pub fn pooled_client(idle: usize) -> HttpClient {
    Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(idle)
        .build_http()
}

/// POST `body` as JSON to `url`; the answer's body once the status is 200.
/// Anything else stops the benchmark, naming the URL, the status and what
/// the server said.
pub async fn post(
    client: &HttpClient,
    url: &str,
    body: &Value,
    connection: Connection,
) -> hyper::body::Incoming {
    let text = body.to_string();
    let request = || {
        let builder = hyper::Request::post(url).header("content-type", "application/json");
        let builder = match connection {
            Connection::Close => builder.header("connection", "close"),
            Connection::Pooled => builder,
        };
        builder
            .body(Full::new(Bytes::from(text.clone())))
            .expect("a request from a URL and a JSON body")
    };
    let mut tries = 0;
    let response = loop {
        match client.request(request()).await {
            Ok(r) => break r,
            Err(e)
                if connection == Connection::Pooled
                    && tries < 3
                    && (e.is_connect() || format!("{e:?}").contains("IncompleteMessage")) =>
            {
                tries += 1
            }
            Err(e) => panic!("POST {url}: {e:?}"),
        }
    };
    let status = response.status();
    let body = response.into_body();
    if status != 200 {
        let text = body
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        panic!(
            "POST {url}: HTTP {status}: {}",
            String::from_utf8_lossy(&text)
        );
    }
    body
}

/// POST and read the whole answer as JSON.
pub async fn post_json(client: &HttpClient, url: &str, body: &Value) -> Value {
    let body = post(client, url, body, Connection::Close).await;
    let bytes = body
        .collect()
        .await
        .unwrap_or_else(|e| panic!("POST {url}: reading the answer: {e}"))
        .to_bytes();
    serde_json::from_slice(&bytes).unwrap_or_else(|e| {
        panic!(
            "POST {url}: not JSON ({e}): {}",
            String::from_utf8_lossy(&bytes)
        )
    })
}

/// The status and body of a GET, or None when nothing answers.
pub async fn get(client: &HttpClient, url: &str) -> Option<(u16, String)> {
    let request = hyper::Request::get(url)
        .header("connection", "close")
        .body(Full::new(Bytes::new()))
        .ok()?;
    let response = client.request(request).await.ok()?;
    let status = response.status().as_u16();
    let body = response.into_body().collect().await.ok()?.to_bytes();
    Some((status, String::from_utf8_lossy(&body).into_owned()))
}

/// Server-sent events out of a body that arrives in arbitrary pieces:
/// whole `data: ...` payloads only, in order.
#[derive(Debug, Default)]
pub struct Events {
    pending: Vec<u8>,
}

impl Events {
    /// Add what arrived.
    pub fn push(&mut self, data: &[u8]) {
        self.pending.extend_from_slice(data);
    }

    /// The next whole event's payload (what follows `data: `), if one has
    /// arrived.
    pub fn next_payload(&mut self) -> Option<Vec<u8>> {
        let end = self.pending.windows(2).position(|w| w == b"\n\n")?;
        let event: Vec<u8> = self.pending.drain(..end + 2).collect();
        let event = &event[..end];
        Some(event.strip_prefix(b"data: ").unwrap_or(event).to_vec())
    }
}

/// Read a streamed answer to its end, handing each JSON event to `each`
/// (`[DONE]` and anything else that is not JSON are skipped).
pub async fn for_each_event(mut body: hyper::body::Incoming, mut each: impl FnMut(&Value)) {
    let mut events = Events::default();
    while let Some(frame) = body.frame().await {
        let Ok(data) = frame.expect("reading the event stream").into_data() else {
            continue;
        };
        events.push(&data);
        while let Some(payload) = events.next_payload() {
            if let Ok(event) = serde_json::from_slice::<Value>(&payload) {
                each(&event);
            }
        }
    }
}

/// Read a streamed answer to its end doing as little as a client can: only
/// the last `"completion_tokens":` is looked for (the CPU benchmark's
/// client shares the cores with what it measures).
pub async fn completion_tokens_only(mut body: hyper::body::Incoming) -> u32 {
    let needle = b"\"completion_tokens\":";
    let mut tail: Vec<u8> = Vec::new();
    let mut generated = 0;
    while let Some(frame) = body.frame().await {
        let Ok(data) = frame.expect("reading the event stream").into_data() else {
            continue;
        };
        tail.extend_from_slice(&data);
        if let Some(at) = tail.windows(needle.len()).position(|w| w == needle) {
            let digits: String = tail[at + needle.len()..]
                .iter()
                .skip_while(|b| **b == b' ')
                .take_while(|b| b.is_ascii_digit())
                .map(|b| *b as char)
                .collect();
            generated = digits.parse().unwrap_or(generated);
        }
        // A needle split across two frames is still found.
        let keep = tail.len().saturating_sub(64);
        tail.drain(..keep);
    }
    generated
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_come_out_whole_whatever_the_pieces() {
        let stream = b"data: {\"a\":1}\n\ndata: {\"b\":2}\n\ndata: [DONE]\n\n";
        for cut in 1..stream.len() {
            let mut events = Events::default();
            let mut seen = Vec::new();
            for piece in [&stream[..cut], &stream[cut..]] {
                events.push(piece);
                while let Some(p) = events.next_payload() {
                    seen.push(String::from_utf8(p).unwrap());
                }
            }
            assert_eq!(seen, ["{\"a\":1}", "{\"b\":2}", "[DONE]"], "cut at {cut}");
        }
    }
}
