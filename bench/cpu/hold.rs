//! `--hold N`: N streams held open at once, through the daemon's OpenAI
//! door and, for comparison, on the engine's own port, in one run.
//!
//! Every stream is a streamed `/v1/completions` of `--tokens` tokens from
//! the zero-cost engine paced at `--token-us`, so all N are open together
//! for the whole generation. Each event's arrival is timed: the gaps
//! between a stream's events, against the same gaps on the engine's own
//! port, are what the relay adds; a stream that got nothing, or much less
//! than its share, is starved. While they run, the daemon's and the
//! worker's resident memory and open file descriptors are sampled; their
//! peak over the level before the round, divided by the most streams open
//! at once, is the cost of one open stream (an upper bound: memory the
//! allocator took is not given back when streams close). Refusals (an HTTP status other than 200) are counted
//! by status, with the first answer of each kind kept for the record.

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use serde_json::json;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tt_bench::http::{Events, HttpClient};
use tt_card_lock::procs;

/// What one stream saw.
#[derive(Default)]
struct Seen {
    /// Its HTTP status (0: no answer at all).
    status: u16,
    /// The body of a refusal.
    refusal: String,
    /// Events with text.
    tokens: u32,
    /// Milliseconds between consecutive text events.
    gaps_ms: Vec<f64>,
    /// From sending the request to its first text event.
    first_ms: Option<f64>,
    /// The stream broke or ended without `[DONE]`.
    broken: Option<String>,
}

/// Memory and descriptors of the relay's processes, sampled.
#[derive(Default, Clone, Copy)]
struct Peak {
    daemon_rss: u64,
    worker_rss: u64,
    daemon_fds: usize,
    worker_fds: usize,
    /// Streams open when the daemon's memory peaked.
    open_at_daemon_peak: usize,
    /// Most streams seen open at once.
    open_max: usize,
}

async fn one(
    client: HttpClient,
    url: String,
    prompt: String,
    tokens: u32,
    open: Arc<AtomicUsize>,
) -> Seen {
    let body = json!({
        "model": "m", "prompt": prompt, "max_tokens": tokens, "temperature": 0,
        "stream": true, "ignore_eos": true,
    })
    .to_string();
    let request = hyper::Request::post(url.as_str())
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body)))
        .expect("a request");
    let sent = Instant::now();
    let mut seen = Seen::default();
    let response = match client.request(request).await {
        Ok(r) => r,
        Err(e) => {
            seen.broken = Some(format!("no answer: {e}"));
            return seen;
        }
    };
    seen.status = response.status().as_u16();
    let mut body = response.into_body();
    if seen.status != 200 {
        let text = body
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        seen.refusal = String::from_utf8_lossy(&text).chars().take(300).collect();
        return seen;
    }
    open.fetch_add(1, Ordering::SeqCst);
    let mut events = Events::default();
    let mut last: Option<Instant> = None;
    let mut done = false;
    while let Some(frame) = body.frame().await {
        let data = match frame {
            Ok(f) => match f.into_data() {
                Ok(d) => d,
                Err(_) => continue,
            },
            Err(e) => {
                seen.broken = Some(format!("the stream broke: {e}"));
                break;
            }
        };
        events.push(&data);
        while let Some(payload) = events.next_payload() {
            if payload == b"[DONE]" {
                done = true;
                continue;
            }
            // The cheap test a client can afford: a text event has a
            // non-empty "text".
            if payload.windows(9).any(|w| w == b"\"text\":\" ") {
                let now = Instant::now();
                match last {
                    Some(prev) => seen
                        .gaps_ms
                        .push(now.duration_since(prev).as_secs_f64() * 1e3),
                    None => seen.first_ms = Some(now.duration_since(sent).as_secs_f64() * 1e3),
                }
                last = Some(now);
                seen.tokens += 1;
            }
        }
    }
    open.fetch_sub(1, Ordering::SeqCst);
    if !done && seen.broken.is_none() {
        seen.broken = Some("ended without [DONE]".into());
    }
    seen
}

fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() - 1) as f64 * q).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn r2(v: f64) -> f64 {
    (v * 100.0).round() / 100.0
}

/// Holds `streams` streams open through `base`, sampling `daemon` and
/// `worker` meanwhile; one JSON record.
#[allow(clippy::too_many_arguments)]
pub async fn run(
    arm: &str,
    base: &str,
    streams: usize,
    tokens: u32,
    token_us: u64,
    daemon: u32,
    worker: u32,
    round: usize,
) -> serde_json::Value {
    let client = tt_bench::http::pooled_client(streams);
    let idle = Peak {
        daemon_rss: procs::rss_bytes(daemon),
        worker_rss: procs::rss_bytes(worker),
        daemon_fds: procs::open_fds(daemon).unwrap_or(0),
        worker_fds: procs::open_fds(worker).unwrap_or(0),
        open_at_daemon_peak: 0,
        open_max: 0,
    };
    let open = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = {
        let (open, stop) = (open.clone(), stop.clone());
        tokio::spawn(async move {
            let mut peak = idle;
            while !stop.load(Ordering::SeqCst) {
                let now_open = open.load(Ordering::SeqCst);
                peak.open_max = peak.open_max.max(now_open);
                let rss = procs::rss_bytes(daemon);
                if rss > peak.daemon_rss {
                    peak.daemon_rss = rss;
                    peak.open_at_daemon_peak = now_open;
                }
                peak.worker_rss = peak.worker_rss.max(procs::rss_bytes(worker));
                peak.daemon_fds = peak.daemon_fds.max(procs::open_fds(daemon).unwrap_or(0));
                peak.worker_fds = peak.worker_fds.max(procs::open_fds(worker).unwrap_or(0));
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            peak
        })
    };
    let url = format!("{base}/v1/completions");
    let started = Instant::now();
    let tasks: Vec<_> = (0..streams)
        .map(|i| {
            let prompt = format!("{round}-{i}. Tell me about the sea");
            tokio::spawn(one(
                client.clone(),
                url.clone(),
                prompt,
                tokens,
                open.clone(),
            ))
        })
        .collect();
    let mut seen = Vec::with_capacity(streams);
    for t in tasks {
        seen.push(t.await.unwrap_or_default());
    }
    let wall = started.elapsed().as_secs_f64();
    stop.store(true, Ordering::SeqCst);
    let peak = sampler.await.unwrap_or(idle);

    let mut refusals: BTreeMap<u16, (usize, String)> = BTreeMap::new();
    for s in seen.iter().filter(|s| s.status != 200) {
        let e = refusals.entry(s.status).or_insert((0, s.refusal.clone()));
        e.0 += 1;
    }
    let served: Vec<&Seen> = seen.iter().filter(|s| s.status == 200).collect();
    let broken: Vec<&str> = seen.iter().filter_map(|s| s.broken.as_deref()).collect();
    let mut gaps: Vec<f64> = served
        .iter()
        .flat_map(|s| s.gaps_ms.iter().copied())
        .collect();
    gaps.sort_by(f64::total_cmp);
    let mut firsts: Vec<f64> = served.iter().filter_map(|s| s.first_ms).collect();
    firsts.sort_by(f64::total_cmp);
    let mut worst: Vec<f64> = served
        .iter()
        .map(|s| s.gaps_ms.iter().copied().fold(0.0, f64::max))
        .collect();
    worst.sort_by(f64::total_cmp);
    let starved = served.iter().filter(|s| s.tokens < tokens).count();
    let got: u64 = served.iter().map(|s| u64::from(s.tokens)).sum();
    // Memory the allocator took stays taken after the streams close, so
    // the peak's growth is shared by the most streams that were open.
    let per_stream = |grown: u64| (peak.open_max > 0).then(|| grown as f64 / peak.open_max as f64);
    json!({
        "bench": "hold_streams", "arm": arm, "round": round,
        "streams": streams, "tokens_per_request": tokens, "token_us": token_us,
        "served": served.len(), "refused": refusals.iter().map(|(k, v)| (k.to_string(), json!({"count": v.0, "first": v.1}))).collect::<serde_json::Map<_, _>>(),
        "broken": broken.len(), "broken_first": broken.first(),
        "starved": starved, "tokens": got, "wall_s": r2(wall), "tok_s": r2(got as f64 / wall),
        "most_open_at_once": peak.open_max,
        "gap_ms": {"p50": r2(quantile(&gaps, 0.5)), "p99": r2(quantile(&gaps, 0.99)), "p999": r2(quantile(&gaps, 0.999)), "max": r2(gaps.last().copied().unwrap_or(f64::NAN))},
        "first_token_ms": {"p50": r2(quantile(&firsts, 0.5)), "p99": r2(quantile(&firsts, 0.99)), "max": r2(firsts.last().copied().unwrap_or(f64::NAN))},
        "worst_gap_per_stream_ms": {"p50": r2(quantile(&worst, 0.5)), "p99": r2(quantile(&worst, 0.99))},
        "daemon": {"rss_idle_mib": r2(idle.daemon_rss as f64 / 1048576.0), "rss_peak_mib": r2(peak.daemon_rss as f64 / 1048576.0),
                   "open_streams_at_peak": peak.open_at_daemon_peak,
                   "kib_per_open_stream": per_stream(peak.daemon_rss.saturating_sub(idle.daemon_rss)).map(|b| r2(b / 1024.0)),
                   "fds_idle": idle.daemon_fds, "fds_peak": peak.daemon_fds},
        "worker": {"rss_idle_mib": r2(idle.worker_rss as f64 / 1048576.0), "rss_peak_mib": r2(peak.worker_rss as f64 / 1048576.0),
                   "fds_idle": idle.worker_fds, "fds_peak": peak.worker_fds},
    })
}
