//! The HTTP endpoint Prometheus scrapes: `GET /metrics` on `metrics.listen`.
//! Read-only; nothing else is served on it.

use crate::shutdown::Shutdown;
use crate::state::DaemonState;
use http_body_util::Full;
use hyper::body::Bytes;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;

/// The OpenMetrics text format, which Prometheus negotiates.
const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Serve until shutdown.
pub async fn serve(listener: TcpListener, state: Arc<DaemonState>, shutdown: Shutdown) {
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    tracing::warn!(error = %e, "metrics endpoint: accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            _ = shutdown.clone().wait() => return,
        };
        let state = state.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |request| {
                let state = state.clone();
                async move { Ok::<_, Infallible>(respond(&state, &request)) }
            });
            let connection = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(Duration::from_secs(10))
                .serve_connection(TokioIo::new(stream), service);
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "metrics connection ended with an error");
            }
        });
    }
}

fn respond<B>(state: &DaemonState, request: &Request<B>) -> Response<Full<Bytes>> {
    let reply = |status: StatusCode, content_type: &str, body: String| {
        let mut response = Response::new(Full::new(Bytes::from(body)));
        *response.status_mut() = status;
        if let Ok(value) = content_type.parse() {
            response
                .headers_mut()
                .insert(hyper::header::CONTENT_TYPE, value);
        }
        response
    };
    match (request.method(), request.uri().path()) {
        (&Method::GET, "/metrics") => {
            let text = crate::metrics::get().render(&snapshot(state));
            reply(StatusCode::OK, CONTENT_TYPE, text)
        }
        (_, "/metrics") => reply(
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain; charset=utf-8",
            "only GET /metrics is served here\n".into(),
        ),
        (_, path) => reply(
            StatusCode::NOT_FOUND,
            "text/plain; charset=utf-8",
            format!("no {path} here; Prometheus metrics are at /metrics\n"),
        ),
    }
}

/// The state gauges' values from the slot and card tables as they are now.
fn snapshot(state: &DaemonState) -> crate::metrics::Snapshot {
    use crate::metrics::{CardGauges, KvGauges, SlotGauges, Snapshot};
    use crate::slots::SlotState;
    Snapshot {
        states: SlotState::ALL.iter().map(|s| s.word()).collect(),
        slots: state
            .slots()
            .iter()
            .map(|s| SlotGauges {
                slot: s.name.clone(),
                model: s.model.clone(),
                state: s.state.word(),
                rss_bytes: s.worker_rss_bytes,
                in_flight: s.in_flight,
                // The last worker's figures stay in the view until the
                // next one is Ready.
                kv: s
                    .kv
                    .filter(|_| s.state == SlotState::Ready)
                    .map(|kv| KvGauges {
                        budget_bytes: kv.budget_bytes,
                        blocks_total: kv.blocks_total,
                        blocks_in_use: kv.blocks_in_use,
                        blocks_cached: kv.blocks_cached,
                    }),
            })
            .collect(),
        waiting: state.router().waiting(),
        cards: state
            .cards()
            .snapshot()
            .iter()
            .filter_map(|c| {
                let t = &c.info.as_ref()?.telemetry;
                Some(CardGauges {
                    card: c.bdf.clone(),
                    temperature_c: t.temperature_c,
                    power_w: t.power_w,
                })
            })
            .collect(),
    }
}
