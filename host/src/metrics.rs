//! Prometheus metrics at `/metrics` on `metrics.listen` (loopback by
//! default), in the names users of vLLM, TGI and Triton already chart,
//! prefixed `tt_serving_`.
//!
//! Events (requests, tokens, latencies, restarts, resets, cache builds,
//! starts) are counted where they happen through [`get`], one registry for
//! the process. States (slot state, queue depth, requests running, worker
//! RSS, card temperature and power) are read from the slot and card tables
//! at each scrape, so they can never drift from what `ttctl status` shows,
//! and slots or cards that went away disappear from the output.
//!
//! The page comes in two formats, chosen by the scraper's `Accept`
//! ([`Format::negotiate`]): OpenMetrics for a scraper that asks for it
//! (Prometheus does, first), the Prometheus text format 0.0.4 for every
//! other client (`curl`, `promtool check metrics`, agents that parse only
//! 0.0.4). They differ in how a counter's `# HELP` and `# TYPE` name it:
//! OpenMetrics names the family (`tt_serving_requests`), 0.0.4 the samples
//! (`tt_serving_requests_total`); a parser of one reading the other finds
//! samples without metadata. Both pages give every registered family its
//! `# HELP` and `# TYPE`, with or without samples ([`Metrics::render`]).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::{Metric, Registry, Unit};
use std::collections::HashSet;
use std::fmt::Write as _;
use std::sync::atomic::AtomicU64;
use std::sync::LazyLock;
use std::time::Duration;

/// `{model}`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ModelLabels {
    /// Model name (configured models only, so the set stays bounded).
    pub model: String,
}

/// `{model, priority}`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PriorityLabels {
    /// Model name.
    pub model: String,
    /// The requests' `priority` (lower is sooner), as a decimal; only the
    /// priorities some request waits at, so at most `max_queue` per model.
    pub priority: String,
}

/// `{model, outcome}`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    /// Model name.
    pub model: String,
    /// How it ended.
    pub outcome: String,
}

/// `{key, model, outcome}`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KeyOutcomeLabels {
    /// The API key's name (from the tokens file; `anonymous` without one).
    pub key: String,
    /// Model name.
    pub model: String,
    /// How it ended.
    pub outcome: String,
}

/// `{key, model, kind}`: `prompt`, `cached_prompt` or `completion`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KeyTokenLabels {
    /// The API key's name.
    pub key: String,
    /// Model name.
    pub model: String,
    /// Which tokens.
    pub kind: String,
}

/// `{slot, model}`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SlotLabels {
    /// Slot name.
    pub slot: String,
    /// Model name.
    pub model: String,
}

/// `{kind}`: `total`, `available` or `shm_used`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HostMemoryLabels {
    /// Which figure.
    pub kind: String,
}

/// `{cap}`: `max_connections` or `max_connections_per_peer`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CapLabels {
    /// The cap a connection was over.
    pub cap: String,
}

/// `{state}`: `total` or `free`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HugepageLabels {
    /// Which count.
    pub state: String,
}

/// `{slot, model, parameter}`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SlotParameterLabels {
    /// Slot name.
    pub slot: String,
    /// Model name.
    pub model: String,
    /// A GenerateRequest parameter's name.
    pub parameter: String,
}

/// `{slot, model, state}`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SlotStateLabels {
    /// Slot name.
    pub slot: String,
    /// Model name.
    pub model: String,
    /// Lifecycle state, lowercase.
    pub state: String,
}

/// `{slot, model, outcome}`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SlotOutcomeLabels {
    /// Slot name.
    pub slot: String,
    /// Model name.
    pub model: String,
    /// `affine` or `fallback`.
    pub outcome: String,
}

/// `{slot, model, state}` of KV blocks.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KvBlockLabels {
    /// Slot name.
    pub slot: String,
    /// Model name.
    pub model: String,
    /// `in_use`, `cached` or `total`.
    pub state: String,
}

/// `{slot, model, cause}`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RestartLabels {
    /// Slot name.
    pub slot: String,
    /// Model name.
    pub model: String,
    /// Why the worker was restarted.
    pub cause: String,
}

/// `{slot, model, mode}`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StartLabels {
    /// Slot name.
    pub slot: String,
    /// Model name.
    pub model: String,
    /// `warm` or `cold`.
    pub mode: String,
}

/// `{card}`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CardLabels {
    /// PCI address.
    pub card: String,
}

/// `{card, outcome}`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CardOutcomeLabels {
    /// PCI address.
    pub card: String,
    /// `proven`, `failed` or `hung`.
    pub outcome: String,
}

/// How a card reset ended, as `card_resets` counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResetOutcome {
    /// Back and proven.
    Proven,
    /// Every attempt failed; the card is quarantined.
    Failed,
    /// tt-smi did not return and was killed; the card is quarantined until
    /// an operator resets it (no automatic reset tries it again).
    Hung,
}

impl ResetOutcome {
    /// The `outcome` label.
    pub fn label(self) -> &'static str {
        match self {
            ResetOutcome::Proven => "proven",
            ResetOutcome::Failed => "failed",
            ResetOutcome::Hung => "hung",
        }
    }
}

type FloatGauge = Gauge<f64, AtomicU64>;

/// Every metric the daemon exports.
pub struct Metrics {
    registry: Registry,
    /// Every family registered, in order, for its metadata.
    families: Vec<Described>,
    requests: Family<OutcomeLabels, Counter>,
    key_requests: Family<KeyOutcomeLabels, Counter>,
    key_tokens: Family<KeyTokenLabels, Counter>,
    prompt_tokens: Family<ModelLabels, Counter>,
    generation_tokens: Family<ModelLabels, Counter>,
    prefix_cache_queries: Family<SlotLabels, Counter>,
    prefix_cache_hits: Family<SlotLabels, Counter>,
    affinity_routed: Family<SlotOutcomeLabels, Counter>,
    host_sampling: Family<SlotParameterLabels, Counter>,
    openai_refused: Family<CapLabels, Counter>,
    host_memory: Family<HostMemoryLabels, Gauge>,
    hugepages: Family<HugepageLabels, Gauge>,
    kv_budget: Family<SlotLabels, Gauge>,
    kv_blocks: Family<KvBlockLabels, Gauge>,
    kv_usage: Family<SlotLabels, FloatGauge>,
    ttft: Family<ModelLabels, Histogram>,
    itl: Family<ModelLabels, Histogram>,
    e2e: Family<ModelLabels, Histogram>,
    waiting: Family<ModelLabels, Gauge>,
    waiting_by_priority: Family<PriorityLabels, Gauge>,
    running: Family<ModelLabels, Gauge>,
    slot_state: Family<SlotStateLabels, Gauge>,
    worker_rss: Family<SlotLabels, Gauge>,
    worker_memory_growth: Family<SlotLabels, Gauge>,
    worker_restarts: Family<RestartLabels, Counter>,
    slot_starts: Family<StartLabels, Counter>,
    card_resets: Family<CardOutcomeLabels, Counter>,
    reset_proof_failures: Family<CardLabels, Counter>,
    reset_duration: Family<CardLabels, Histogram>,
    cache_builds: Family<OutcomeLabels, Counter>,
    cache_build_duration: Family<ModelLabels, Histogram>,
    card_temperature: Family<CardLabels, FloatGauge>,
    card_power: Family<CardLabels, FloatGauge>,
}

fn latency_histogram() -> Histogram {
    // 1 ms .. ~65 s.
    Histogram::new(exponential_buckets(0.001, 2.0, 17))
}

fn token_latency_histogram() -> Histogram {
    // 0.5 ms .. ~4 s.
    Histogram::new(exponential_buckets(0.0005, 2.0, 14))
}

fn slow_histogram() -> Histogram {
    // 0.5 s .. ~2.3 h: resets and cold builds.
    Histogram::new(exponential_buckets(0.5, 2.0, 15))
}

impl Metrics {
    fn new() -> Metrics {
        let mut registrar = Registrar {
            registry: Registry::with_prefix(PREFIX),
            families: Vec::new(),
        };
        let m = Metrics {
            requests: Family::default(),
            key_requests: Family::default(),
            key_tokens: Family::default(),
            prompt_tokens: Family::default(),
            generation_tokens: Family::default(),
            prefix_cache_queries: Family::default(),
            prefix_cache_hits: Family::default(),
            affinity_routed: Family::default(),
            host_sampling: Family::default(),
            openai_refused: Family::default(),
            host_memory: Family::default(),
            hugepages: Family::default(),
            kv_budget: Family::default(),
            kv_blocks: Family::default(),
            kv_usage: Family::default(),
            ttft: Family::new_with_constructor(latency_histogram),
            itl: Family::new_with_constructor(token_latency_histogram),
            e2e: Family::new_with_constructor(latency_histogram),
            waiting: Family::default(),
            waiting_by_priority: Family::default(),
            running: Family::default(),
            slot_state: Family::default(),
            worker_rss: Family::default(),
            worker_memory_growth: Family::default(),
            worker_restarts: Family::default(),
            slot_starts: Family::default(),
            card_resets: Family::default(),
            reset_proof_failures: Family::default(),
            reset_duration: Family::new_with_constructor(slow_histogram),
            cache_builds: Family::default(),
            cache_build_duration: Family::new_with_constructor(slow_histogram),
            card_temperature: Family::default(),
            card_power: Family::default(),
            registry: Registry::default(),
            families: Vec::new(),
        };
        let r = &mut registrar;
        r.register(
            "requests",
            "Inference requests by model and outcome (ok, cancelled, invalid, unknown_model, unavailable, queue_full, deadline, worker_error)",
            m.requests.clone(),
        );
        r.register(
            "key_requests",
            "Inference requests by API key name (inference.tokens_file; anonymous without a token), model and outcome (as requests)",
            m.key_requests.clone(),
        );
        r.register(
            "key_tokens",
            "Tokens of finished requests by API key name, model and kind (prompt, cached_prompt: of the prompt, those the prefix cache supplied, completion)",
            m.key_tokens.clone(),
        );
        r.register(
            "prompt_tokens",
            "Prompt tokens of finished requests",
            m.prompt_tokens.clone(),
        );
        r.register(
            "generation_tokens",
            "Generated tokens of finished requests",
            m.generation_tokens.clone(),
        );
        r.register(
            "prefix_cache_queries",
            "Prompt tokens of finished requests, by the slot that served them (vLLM's prefix_cache_queries)",
            m.prefix_cache_queries.clone(),
        );
        r.register(
            "prefix_cache_hits",
            "Of those, the prompt tokens the engine's prefix cache supplied (Timings.cached_prompt_tokens; vLLM's prefix_cache_hits)",
            m.prefix_cache_hits.clone(),
        );
        r.register(
            "affinity_routed",
            "Requests routed among two or more Ready replicas with prefix affinity: to their key's replica (affine) or elsewhere, as it was over the load bound or full (fallback)",
            m.affinity_routed.clone(),
        );
        r.register_with_unit(
            "host_memory",
            "The host's memory (MemTotal, MemAvailable from meminfo; /dev/shm used), under the daemon's hardware roots",
            Unit::Bytes,
            m.host_memory.clone(),
        );
        r.register(
            "host_hugepages_1g",
            "The host's 1 GiB hugepages (reserved, free), which tt-metal engines pin their host buffers in; models.<name>.hugepages_per_card says what each slot needs",
            m.hugepages.clone(),
        );
        r.register(
            "openai_connections_refused",
            "Connections the OpenAI front door refused at accept, by the cap they were over (openai.max_connections, max_connections_per_peer)",
            m.openai_refused.clone(),
        );
        r.register(
            "host_sampling_requests",
            "Requests served on the engine's host-sampling path, by the parameter that put them there (Engine.Info host_sampling_parameters): on vLLM-TT one such request moves its whole batch off device sampling",
            m.host_sampling.clone(),
        );
        r.register_with_unit(
            "kv_cache_budget",
            "The KV memory budget the slot's engine reports (Engine.Info kv_cache), all ranks together",
            Unit::Bytes,
            m.kv_budget.clone(),
        );
        r.register(
            "kv_cache_blocks",
            "KV blocks of the slot's engine: in_use (running sequences), cached (kept only for prefix reuse), total",
            m.kv_blocks.clone(),
        );
        r.register(
            "kv_cache_usage_perc",
            "Share of the slot's KV blocks held by running sequences, 0 to 1 (vLLM's kv_cache_usage_perc)",
            m.kv_usage.clone(),
        );
        r.register_with_unit(
            "time_to_first_token",
            "From arrival at the daemon to the first generated token",
            Unit::Seconds,
            m.ttft.clone(),
        );
        r.register_with_unit(
            "inter_token_latency",
            "Time between generated tokens as the client sees them",
            Unit::Seconds,
            m.itl.clone(),
        );
        r.register_with_unit(
            "e2e_request_latency",
            "From arrival at the daemon to the end of the response",
            Unit::Seconds,
            m.e2e.clone(),
        );
        r.register(
            "num_requests_waiting",
            "Requests in the model's queue, waiting for a slot",
            m.waiting.clone(),
        );
        r.register(
            "num_requests_waiting_by_priority",
            "Requests in the model's queue by priority (lower is served sooner)",
            m.waiting_by_priority.clone(),
        );
        r.register(
            "num_requests_running",
            "Requests being served by the model's slots",
            m.running.clone(),
        );
        r.register(
            "slot_state",
            "1 for the state each slot is in, 0 for the others",
            m.slot_state.clone(),
        );
        r.register_with_unit(
            "worker_resident_memory",
            "Resident memory of each slot's worker and everything it started",
            Unit::Bytes,
            m.worker_rss.clone(),
        );
        r.register(
            "worker_memory_growth_bytes_per_hour",
            "How fast each serving worker's memory grows, when it grows steadily over restart.rss_growth_window_secs (0 otherwise): a leak seen before a limit or the OOM killer ends it",
            m.worker_memory_growth.clone(),
        );
        r.register(
            "worker_restarts",
            "Worker restarts by cause (exit_code, signal, oom, watchdog, rss, start_failed)",
            m.worker_restarts.clone(),
        );
        r.register(
            "slot_starts",
            "Slot starts that reached Ready, by cache mode (warm, cold)",
            m.slot_starts.clone(),
        );
        r.register(
            "card_resets",
            "Card resets by outcome (proven: back and proven; failed: quarantined; hung: tt-smi did not return, quarantined until an operator resets the card)",
            m.card_resets.clone(),
        );
        r.register(
            "card_reset_proof_failures",
            "Reset attempts whose proof failed (device, sysfs, heartbeat or probe)",
            m.reset_proof_failures.clone(),
        );
        r.register_with_unit(
            "card_reset_duration",
            "Duration of card resets, from tt-smi to proof or give-up",
            Unit::Seconds,
            m.reset_duration.clone(),
        );
        r.register(
            "cache_builds",
            "Cold tensor-cache builds by outcome (ok, failed)",
            m.cache_builds.clone(),
        );
        r.register_with_unit(
            "cache_build_duration",
            "Duration of successful cold builds, worker start to marker",
            Unit::Seconds,
            m.cache_build_duration.clone(),
        );
        r.register_with_unit(
            "card_temperature",
            "ASIC temperature from hwmon",
            Unit::Celsius,
            m.card_temperature.clone(),
        );
        r.register(
            "card_power_watts",
            "Board power from hwmon",
            m.card_power.clone(),
        );
        Metrics {
            registry: registrar.registry,
            families: registrar.families,
            ..m
        }
    }

    /// A request ended.
    pub fn request(&self, model: &str, outcome: &str) {
        self.requests
            .get_or_create(&OutcomeLabels {
                model: model.to_string(),
                outcome: outcome.to_string(),
            })
            .inc();
    }

    /// A request finished with its final chunk.
    pub fn tokens(&self, model: &str, prompt: u32, generated: u32) {
        let labels = model_labels(model);
        self.prompt_tokens
            .get_or_create(&labels)
            .inc_by(prompt.into());
        self.generation_tokens
            .get_or_create(&labels)
            .inc_by(generated.into());
    }

    /// A request of API key `key` ended.
    pub fn key_request(&self, key: &str, model: &str, outcome: &str) {
        self.key_requests
            .get_or_create(&KeyOutcomeLabels {
                key: key.to_string(),
                model: model.to_string(),
                outcome: outcome.to_string(),
            })
            .inc();
    }

    /// A request of API key `key` finished with this usage.
    pub fn key_tokens(&self, key: &str, model: &str, prompt: u32, cached: u32, completion: u32) {
        for (kind, n) in [
            ("prompt", prompt),
            ("cached_prompt", cached),
            ("completion", completion),
        ] {
            self.key_tokens
                .get_or_create(&KeyTokenLabels {
                    key: key.to_string(),
                    model: model.to_string(),
                    kind: kind.to_string(),
                })
                .inc_by(n.into());
        }
    }

    /// A finished request's prompt had `prompt` tokens, `cached` of them
    /// from the prefix cache of `slot`'s engine.
    pub fn prefix_cache(&self, model: &str, slot: &str, prompt: u32, cached: u32) {
        let labels = SlotLabels {
            slot: slot.to_string(),
            model: model.to_string(),
        };
        self.prefix_cache_queries
            .get_or_create(&labels)
            .inc_by(prompt.into());
        self.prefix_cache_hits
            .get_or_create(&labels)
            .inc_by(cached.into());
    }

    /// A request was routed to `slot` among several Ready replicas with
    /// prefix affinity; `outcome` is `affine` or `fallback`.
    pub fn affinity_routed(&self, model: &str, slot: &str, outcome: &str) {
        self.affinity_routed
            .get_or_create(&SlotOutcomeLabels {
                slot: slot.to_string(),
                model: model.to_string(),
                outcome: outcome.to_string(),
            })
            .inc();
    }

    /// The OpenAI door refused a connection over `cap`.
    pub fn openai_connection_refused(&self, cap: &str) {
        self.openai_refused
            .get_or_create(&CapLabels {
                cap: cap.to_string(),
            })
            .inc();
    }

    /// A request routed to `slot` asked for `parameter`, which its
    /// engine honours by sampling on the host.
    pub fn host_sampling(&self, model: &str, slot: &str, parameter: &str) {
        self.host_sampling
            .get_or_create(&SlotParameterLabels {
                slot: slot.to_string(),
                model: model.to_string(),
                parameter: parameter.to_string(),
            })
            .inc();
    }

    /// Time to the first token.
    pub fn first_token(&self, model: &str, after: Duration) {
        self.ttft
            .get_or_create(&model_labels(model))
            .observe(after.as_secs_f64());
    }

    /// The inter-token latency histogram of `model`, looked up once per
    /// request: a stream observes it at every token, and the lookup (a
    /// label set built, hashed and found under a lock) would cost more
    /// than the observation.
    pub fn inter_token(&self, model: &str) -> InterToken {
        InterToken(self.itl.get_or_create(&model_labels(model)).clone())
    }

    /// End-to-end latency of a request.
    pub fn end_to_end(&self, model: &str, took: Duration) {
        self.e2e
            .get_or_create(&model_labels(model))
            .observe(took.as_secs_f64());
    }

    /// A worker is being restarted for `cause`.
    pub fn worker_restart(&self, slot: &str, model: &str, cause: &str) {
        self.worker_restarts
            .get_or_create(&RestartLabels {
                slot: slot.to_string(),
                model: model.to_string(),
                cause: cause.to_string(),
            })
            .inc();
    }

    /// A slot reached Ready after a `mode` (warm or cold) start.
    pub fn slot_start(&self, slot: &str, model: &str, mode: &str) {
        self.slot_starts
            .get_or_create(&StartLabels {
                slot: slot.to_string(),
                model: model.to_string(),
                mode: mode.to_string(),
            })
            .inc();
    }

    /// A reset ended: proven back, given up, or hung; how long it took.
    pub fn card_reset(&self, card: &str, outcome: ResetOutcome, took: Duration) {
        self.card_resets
            .get_or_create(&CardOutcomeLabels {
                card: card.to_string(),
                outcome: outcome.label().into(),
            })
            .inc();
        self.reset_duration
            .get_or_create(&card_labels(card))
            .observe(took.as_secs_f64());
    }

    /// One reset attempt's proof failed.
    pub fn reset_proof_failure(&self, card: &str) {
        self.reset_proof_failures
            .get_or_create(&card_labels(card))
            .inc();
    }

    /// A cold build ended; `took` is counted for successful builds.
    pub fn cache_build(&self, model: &str, ok: bool, took: Duration) {
        self.cache_builds
            .get_or_create(&OutcomeLabels {
                model: model.to_string(),
                outcome: if ok { "ok" } else { "failed" }.into(),
            })
            .inc();
        if ok {
            self.cache_build_duration
                .get_or_create(&model_labels(model))
                .observe(took.as_secs_f64());
        }
    }

    /// Set the state gauges from the tables as they are now.
    fn refresh(&self, now: &Snapshot) {
        self.slot_state.clear();
        self.worker_rss.clear();
        self.worker_memory_growth.clear();
        self.running.clear();
        self.waiting.clear();
        self.waiting_by_priority.clear();
        self.card_temperature.clear();
        self.card_power.clear();
        self.kv_budget.clear();
        self.kv_blocks.clear();
        self.kv_usage.clear();
        for s in &now.slots {
            for state in &now.states {
                self.slot_state
                    .get_or_create(&SlotStateLabels {
                        slot: s.slot.clone(),
                        model: s.model.clone(),
                        state: state.to_string(),
                    })
                    .set(i64::from(s.state == *state));
            }
            let labels = SlotLabels {
                slot: s.slot.clone(),
                model: s.model.clone(),
            };
            self.worker_rss
                .get_or_create(&labels)
                .set(i64::try_from(s.rss_bytes).unwrap_or(i64::MAX));
            self.worker_memory_growth
                .get_or_create(&labels)
                .set(i64::try_from(s.memory_growth_per_hour).unwrap_or(i64::MAX));
            self.running
                .get_or_create(&model_labels(&s.model))
                .inc_by(i64::from(s.in_flight));
            if let Some(kv) = &s.kv {
                self.kv_budget
                    .get_or_create(&labels)
                    .set(i64::try_from(kv.budget_bytes).unwrap_or(i64::MAX));
                for (state, blocks) in [
                    ("in_use", kv.blocks_in_use),
                    ("cached", kv.blocks_cached),
                    ("total", kv.blocks_total),
                ] {
                    self.kv_blocks
                        .get_or_create(&KvBlockLabels {
                            slot: s.slot.clone(),
                            model: s.model.clone(),
                            state: state.to_string(),
                        })
                        .set(i64::from(blocks));
                }
                if kv.blocks_total > 0 {
                    self.kv_usage
                        .get_or_create(&labels)
                        .set(f64::from(kv.blocks_in_use) / f64::from(kv.blocks_total));
                }
            }
        }
        for (model, n) in &now.waiting {
            self.waiting
                .get_or_create(&model_labels(model))
                .set(i64::from(*n));
        }
        for (model, priority, n) in &now.waiting_by_priority {
            self.waiting_by_priority
                .get_or_create(&PriorityLabels {
                    model: model.clone(),
                    priority: priority.to_string(),
                })
                .set(i64::from(*n));
        }
        self.host_memory.clear();
        self.hugepages.clear();
        for (kind, value) in [
            ("total", now.host.mem_total_bytes),
            ("available", now.host.mem_available_bytes),
            ("shm_used", now.shm_used_bytes),
        ] {
            if let Some(v) = value {
                self.host_memory
                    .get_or_create(&HostMemoryLabels { kind: kind.into() })
                    .set(i64::try_from(v).unwrap_or(i64::MAX));
            }
        }
        for (state, value) in [
            ("total", now.host.hugepages_total),
            ("free", now.host.hugepages_free),
        ] {
            if let Some(v) = value {
                self.hugepages
                    .get_or_create(&HugepageLabels {
                        state: state.into(),
                    })
                    .set(i64::try_from(v).unwrap_or(i64::MAX));
            }
        }
        for c in &now.cards {
            if let Some(v) = c.temperature_c {
                self.card_temperature
                    .get_or_create(&card_labels(&c.card))
                    .set(v);
            }
            if let Some(v) = c.power_w {
                self.card_power.get_or_create(&card_labels(&c.card)).set(v);
            }
        }
    }

    /// The text exposition in `format`, with the state gauges set from
    /// `now`.
    pub fn render(&self, now: &Snapshot, format: Format) -> String {
        self.refresh(now);
        let mut out = String::new();
        if let Err(e) = self.encode(&mut out, format) {
            tracing::error!(error = %e, "cannot encode metrics");
        }
        out
    }

    fn encode(&self, out: &mut String, format: Format) -> std::fmt::Result {
        use prometheus_client::encoding::{prometheus_text, text};
        match format {
            Format::OpenMetrics => {
                text::encode_registry(out, &self.registry)?;
                self.describe_the_rest(out, format)?;
                text::encode_eof(out)
            }
            Format::Prometheus => {
                prometheus_text::encode(out, &self.registry)?;
                self.describe_the_rest(out, format)
            }
        }
    }

    /// The library's encoders write the families that have samples, each
    /// with its `# HELP` and `# TYPE`, and leave out those without (a
    /// labelled counter before its first event, the priority gauge while
    /// nothing waits). This is the one place that writes the metadata of
    /// those, from what was registered, so that every family is named on
    /// the page with its type whether it has samples yet or not, and keeps
    /// that metadata when its samples come.
    fn describe_the_rest(&self, out: &mut String, format: Format) -> std::fmt::Result {
        let written: HashSet<String> = out
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE ")?.split(' ').next())
            .map(str::to_string)
            .collect();
        for family in &self.families {
            let name = family.name(format);
            if written.contains(&name) {
                continue;
            }
            writeln!(out, "# HELP {name} {}", escape_help(&family.help, format))?;
            writeln!(out, "# TYPE {name} {}", family.kind(format))?;
            if let (Format::OpenMetrics, Some(unit)) = (format, &family.unit) {
                writeln!(out, "# UNIT {name} {unit}")?;
            }
        }
        Ok(())
    }
}

/// The prefix of every family's name.
const PREFIX: &str = "tt_serving";

/// The registry being filled, and what each family registered in it is.
struct Registrar {
    registry: Registry,
    families: Vec<Described>,
}

impl Registrar {
    fn register(&mut self, name: &str, help: &str, metric: impl Metric) {
        self.describe(name, help, None, metric.metric_type());
        self.registry.register(name, help, metric);
    }

    fn register_with_unit(&mut self, name: &str, help: &str, unit: Unit, metric: impl Metric) {
        self.describe(name, help, Some(&unit), metric.metric_type());
        self.registry.register_with_unit(name, help, unit, metric);
    }

    /// Named and helped as the library's encoders name and help it.
    fn describe(&mut self, name: &str, help: &str, unit: Option<&Unit>, kind: MetricType) {
        let unit = unit.map(|u| u.as_str().to_string());
        let family = match &unit {
            Some(unit) => format!("{PREFIX}_{name}_{unit}"),
            None => format!("{PREFIX}_{name}"),
        };
        self.families.push(Described {
            family,
            help: format!("{help}."),
            unit,
            kind,
        });
    }
}

/// One registered family's metadata.
#[derive(Debug)]
struct Described {
    /// The family's name as OpenMetrics has it (a counter without
    /// `_total`).
    family: String,
    help: String,
    unit: Option<String>,
    kind: MetricType,
}

impl Described {
    /// The name `# HELP` and `# TYPE` give it in `format`.
    fn name(&self, format: Format) -> String {
        match (format, self.kind) {
            (Format::Prometheus, MetricType::Counter) => format!("{}_total", self.family),
            _ => self.family.clone(),
        }
    }

    /// Its type as `format` words it.
    fn kind(&self, format: Format) -> &'static str {
        match (format, self.kind) {
            (_, MetricType::Counter) => "counter",
            (_, MetricType::Gauge) => "gauge",
            (_, MetricType::Histogram) => "histogram",
            (Format::OpenMetrics, MetricType::Info) => "info",
            (Format::Prometheus, MetricType::Info) => "gauge",
            (Format::OpenMetrics, _) => "unknown",
            (Format::Prometheus, _) => "untyped",
        }
    }
}

/// `# HELP` text escaped as `format` escapes it.
fn escape_help(help: &str, format: Format) -> String {
    let help = help.replace('\\', "\\\\").replace('\n', "\\n");
    match format {
        Format::OpenMetrics => help.replace('"', "\\\""),
        Format::Prometheus => help,
    }
}

/// The text formats of `/metrics`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// OpenMetrics 1.0.0: a counter's family is named without `_total`,
    /// units have a `# UNIT` line, the page ends in `# EOF`.
    OpenMetrics,
    /// The Prometheus text format 0.0.4: a counter's `# HELP` and `# TYPE`
    /// name its samples, `..._total`.
    Prometheus,
}

impl Format {
    /// OpenMetrics when `accept` (the request's `Accept` values, joined
    /// by commas) lists `application/openmetrics-text` with a weight above
    /// 0 and no lower than any `text/plain` (or wildcard) range it lists;
    /// 0.0.4 otherwise, as without an `Accept` or with `*/*` only.
    pub fn negotiate(accept: Option<&str>) -> Format {
        let (mut openmetrics, mut text) = (0.0_f64, 0.0_f64);
        for range in accept.unwrap_or("").split(',') {
            let mut parts = range.split(';');
            let media = parts.next().unwrap_or("").trim().to_ascii_lowercase();
            let weight = parts
                .filter_map(|p| p.trim().strip_prefix("q="))
                .map(|q| q.trim().parse::<f64>().unwrap_or(0.0))
                .next()
                .unwrap_or(1.0);
            match media.as_str() {
                "application/openmetrics-text" => openmetrics = openmetrics.max(weight),
                "text/plain" | "text/*" | "*/*" => text = text.max(weight),
                _ => {}
            }
        }
        if openmetrics > 0.0 && openmetrics >= text {
            Format::OpenMetrics
        } else {
            Format::Prometheus
        }
    }

    /// The response's `Content-Type`.
    pub fn content_type(self) -> &'static str {
        match self {
            Format::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
            Format::Prometheus => prometheus_client::encoding::prometheus_text::CONTENT_TYPE,
        }
    }
}

/// What the state gauges show at a scrape. The caller (the metrics
/// endpoint) gathers it from the slot and card tables; the registry sits
/// below them and never reads them, so cards, slots and the router can all
/// record events here.
#[derive(Debug, Default)]
pub struct Snapshot {
    /// Every slot state word, so each slot gets a 0/1 gauge per state.
    pub states: Vec<&'static str>,
    /// Each slot.
    pub slots: Vec<SlotGauges>,
    /// Requests waiting per model.
    pub waiting: Vec<(String, u32)>,
    /// Requests waiting per model and priority.
    pub waiting_by_priority: Vec<(String, i32, u32)>,
    /// Each card's sensors.
    pub cards: Vec<CardGauges>,
    /// The host's hugepages and RAM, where readable.
    pub host: crate::host_memory::HostMemory,
    /// Bytes used on /dev/shm, where readable.
    pub shm_used_bytes: Option<u64>,
}

/// One slot's gauges.
#[derive(Debug)]
pub struct SlotGauges {
    /// The slot's name.
    pub slot: String,
    /// Its model.
    pub model: String,
    /// Its state word (one of [`Snapshot::states`]).
    pub state: &'static str,
    /// The worker's RSS in bytes.
    pub rss_bytes: u64,
    /// Its worker's steady memory growth, bytes per hour (0: none).
    pub memory_growth_per_hour: u64,
    /// Requests running on it.
    pub in_flight: u32,
    /// Its engine's KV memory, while it is Ready and its engine says.
    pub kv: Option<KvGauges>,
}

/// One slot's KV memory gauges.
#[derive(Debug, Clone, Copy)]
pub struct KvGauges {
    /// The budget in bytes.
    pub budget_bytes: u64,
    /// Blocks the budget holds.
    pub blocks_total: u32,
    /// Blocks held by running sequences.
    pub blocks_in_use: u32,
    /// Blocks held only by the prefix cache.
    pub blocks_cached: u32,
}

/// One card's sensor gauges.
#[derive(Debug)]
pub struct CardGauges {
    /// The card's BDF.
    pub card: String,
    /// ASIC temperature, when readable.
    pub temperature_c: Option<f64>,
    /// Board power, when readable.
    pub power_w: Option<f64>,
}

/// One model's inter-token histogram (`Metrics::inter_token`).
pub struct InterToken(Histogram);

impl InterToken {
    /// `tokens` tokens arrived `gap` after the previous ones.
    pub fn observe(&self, gap: Duration, tokens: usize) {
        let per_token = gap.as_secs_f64() / tokens.max(1) as f64;
        for _ in 0..tokens.max(1) {
            self.0.observe(per_token);
        }
    }
}

fn model_labels(model: &str) -> ModelLabels {
    ModelLabels {
        model: model.to_string(),
    }
}

fn card_labels(card: &str) -> CardLabels {
    CardLabels {
        card: card.to_string(),
    }
}

static METRICS: LazyLock<Metrics> = LazyLock::new(Metrics::new);

/// The process's metrics.
pub fn get() -> &'static Metrics {
    &METRICS
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slot(name: &str, kv: Option<KvGauges>) -> SlotGauges {
        SlotGauges {
            slot: name.into(),
            model: "m".into(),
            state: "ready",
            rss_bytes: 0,
            memory_growth_per_hour: 0,
            in_flight: 0,
            kv,
        }
    }

    #[test]
    fn kv_memory_and_the_prefix_cache_counters_are_exported_per_slot() {
        let metrics = Metrics::new();
        metrics.prefix_cache("m", "m/0", 600, 0);
        metrics.prefix_cache("m", "m/0", 640, 592);
        metrics.affinity_routed("m", "m/0", "affine");
        let snapshot = Snapshot {
            states: vec!["ready"],
            slots: vec![
                slot(
                    "m/0",
                    Some(KvGauges {
                        budget_bytes: 512 << 20,
                        blocks_total: 1024,
                        blocks_in_use: 256,
                        blocks_cached: 100,
                    }),
                ),
                // An engine that does not report its KV memory: no gauges.
                slot("m/1", None),
            ],
            ..Snapshot::default()
        };
        let text = metrics.render(&snapshot, Format::OpenMetrics);
        for line in [
            "tt_serving_prefix_cache_queries_total{slot=\"m/0\",model=\"m\"} 1240",
            "tt_serving_prefix_cache_hits_total{slot=\"m/0\",model=\"m\"} 592",
            "tt_serving_affinity_routed_total{slot=\"m/0\",model=\"m\",outcome=\"affine\"} 1",
            "tt_serving_kv_cache_budget_bytes{slot=\"m/0\",model=\"m\"} 536870912",
            "tt_serving_kv_cache_blocks{slot=\"m/0\",model=\"m\",state=\"in_use\"} 256",
            "tt_serving_kv_cache_blocks{slot=\"m/0\",model=\"m\",state=\"cached\"} 100",
            "tt_serving_kv_cache_blocks{slot=\"m/0\",model=\"m\",state=\"total\"} 1024",
            "tt_serving_kv_cache_usage_perc{slot=\"m/0\",model=\"m\"} 0.25",
        ] {
            assert!(text.lines().any(|l| l == line), "no `{line}` in:\n{text}");
        }
        assert!(!text.contains("kv_cache_blocks{slot=\"m/1\""), "{text}");
        // A slot that left Ready (or went away) loses its gauges.
        let text = metrics.render(&Snapshot::default(), Format::OpenMetrics);
        assert!(!text.contains("kv_cache_blocks{"), "{text}");
    }

    /// `(name, type)` of every `# TYPE` line, and whether each has a
    /// `# HELP` line of the same name before it.
    fn typed(page: &str) -> Vec<(String, String, bool)> {
        let mut helped = HashSet::new();
        let mut out = Vec::new();
        for line in page.lines() {
            if let Some(rest) = line.strip_prefix("# HELP ") {
                helped.insert(rest.split(' ').next().unwrap_or("").to_string());
            } else if let Some((name, kind)) =
                line.strip_prefix("# TYPE ").and_then(|r| r.split_once(' '))
            {
                out.push((name.to_string(), kind.to_string(), helped.contains(name)));
            }
        }
        out
    }

    #[test]
    fn both_formats_describe_every_family_with_samples_or_without() {
        let metrics = Metrics::new();
        // One family with samples, the rest without.
        metrics.request("m", "ok");
        let snapshot = Snapshot::default();
        let openmetrics = metrics.render(&snapshot, Format::OpenMetrics);
        let prometheus = metrics.render(&snapshot, Format::Prometheus);
        let om = typed(&openmetrics);
        let text = typed(&prometheus);
        assert_eq!(om.len(), metrics.families.len(), "{openmetrics}");
        assert!(metrics.families.len() > 30);
        assert!(om.iter().all(|(_, _, help)| *help), "{openmetrics}");
        assert!(text.iter().all(|(_, _, help)| *help), "{prometheus}");
        // The same families and types, a counter named by its samples in
        // 0.0.4.
        let mut expected: Vec<(String, String)> = om
            .iter()
            .map(|(name, kind, _)| match kind.as_str() {
                "counter" => (format!("{name}_total"), kind.clone()),
                _ => (name.clone(), kind.clone()),
            })
            .collect();
        let mut got: Vec<(String, String)> = text
            .into_iter()
            .map(|(name, kind, _)| (name, kind))
            .collect();
        expected.sort();
        got.sort();
        assert_eq!(got, expected, "{prometheus}");
        let lines: Vec<&str> = prometheus.lines().collect();
        let at = lines
            .iter()
            .position(|l| *l == "# TYPE tt_serving_requests_total counter")
            .unwrap_or_else(|| panic!("{prometheus}"));
        assert_eq!(
            lines.get(at + 1),
            Some(&"tt_serving_requests_total{model=\"m\",outcome=\"ok\"} 1"),
            "{prometheus}"
        );
        assert!(
            prometheus.contains("# TYPE tt_serving_worker_restarts_total counter\n"),
            "a counter without samples: {prometheus}"
        );
        assert!(!prometheus.contains("# EOF"), "{prometheus}");
        assert!(openmetrics.trim_end().ends_with("# EOF"), "{openmetrics}");
    }

    #[test]
    fn openmetrics_goes_to_scrapers_that_ask_for_it_and_0_0_4_to_the_rest() {
        let prometheus_2 = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
        // Before Prometheus 2.43 (OpenMetrics 1.0.0 came then).
        let prometheus_2_42 =
            "application/openmetrics-text; version=0.0.1,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
        for (accept, format) in [
            (Some(prometheus_2), Format::OpenMetrics),
            (Some(prometheus_2_42), Format::OpenMetrics),
            (Some("application/openmetrics-text"), Format::OpenMetrics),
            (
                Some("text/plain;version=0.0.4;q=0.5,*/*;q=0.1"),
                Format::Prometheus,
            ),
            (Some("*/*"), Format::Prometheus),
            (Some(""), Format::Prometheus),
            (None, Format::Prometheus),
            (
                Some("application/openmetrics-text;q=0,text/plain"),
                Format::Prometheus,
            ),
            (
                Some("text/plain;q=0.9,application/openmetrics-text;q=0.5"),
                Format::Prometheus,
            ),
            (Some("application/openmetrics-text;q=x"), Format::Prometheus),
        ] {
            assert_eq!(Format::negotiate(accept), format, "{accept:?}");
        }
    }
}
