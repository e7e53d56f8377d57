//! The HTTP endpoint Prometheus scrapes: `GET /metrics` on `metrics.listen`.
//! Read-only; nothing else is served on it.

use crate::metrics::Format;
use crate::shutdown::Shutdown;
use crate::state::DaemonState;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;

const TEXT: &str = "text/plain; charset=utf-8";

/// Serve until shutdown. The routes are axum's; each connection is
/// hyper's own so that a client must send its request head within 10 s
/// (a scraper never needs longer, and idle half-requests cost nothing).
pub async fn serve(listener: TcpListener, state: Arc<DaemonState>, shutdown: Shutdown) {
    let app = Router::new()
        .route("/metrics", get(metrics).fallback(only_get))
        .fallback(not_found)
        .with_state(state);
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
        let service = TowerToHyperService::new(app.clone());
        tokio::spawn(async move {
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

/// The page in the format the scraper's `Accept` asks for: OpenMetrics
/// for Prometheus, the 0.0.4 text format for `curl` and `promtool`.
async fn metrics(State(state): State<Arc<DaemonState>>, headers: HeaderMap) -> Response {
    let accept: Vec<&str> = headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .collect();
    let format = Format::negotiate(Some(&accept.join(",")));
    let text = crate::metrics::get().render(&snapshot(&state), format);
    ([(header::CONTENT_TYPE, format.content_type())], text).into_response()
}

async fn only_get() -> Response {
    (
        StatusCode::METHOD_NOT_ALLOWED,
        [(header::CONTENT_TYPE, TEXT)],
        "only GET /metrics is served here\n",
    )
        .into_response()
}

async fn not_found(request: Request) -> Response {
    (
        StatusCode::NOT_FOUND,
        [(header::CONTENT_TYPE, TEXT)],
        format!(
            "no {} here; Prometheus metrics are at /metrics\n",
            crate::echo::echo(request.uri().path())
        ),
    )
        .into_response()
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
                memory_growth_per_hour: s.memory_growth_per_hour,
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
        waiting_by_priority: state.router().waiting_by_priority(),
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
        host: crate::host_memory::HostMemory::read(state.cards().hardware()),
        shm_used_bytes: shm_used(&state.cards().hardware().dev_root.join("shm")),
    }
}

/// Bytes in use on the shared-memory filesystem (tt-umd's locks, Open
/// MPI's segments and the engines' buffers live there).
fn shm_used(dir: &std::path::Path) -> Option<u64> {
    let v = nix::sys::statvfs::statvfs(dir).ok()?;
    // The field types differ by platform (c_ulong, fsblkcnt_t).
    let (blocks, free, size) = (v.blocks(), v.blocks_free(), v.fragment_size());
    #[allow(clippy::useless_conversion)]
    let used = u64::from(blocks).saturating_sub(u64::from(free));
    #[allow(clippy::useless_conversion)]
    Some(used.saturating_mul(u64::from(size)))
}
