//! Prefix affinity across the replicas of one model: real daemon, two real
//! `tt-worker` replicas with the tiny test model on fake cards. A
//! conversation's turns (the same leading messages, a growing history) are
//! all served by one replica, the slot the final chunk names, while other
//! conversations use the other; one hot prompt cannot pile onto its
//! replica past the load bound; a replica that goes away hands its
//! conversations to the survivor without a client error. The per-slot
//! prompt-token and routing counters are read from `/metrics`, and the
//! prefix-cache hit rate and KV memory from `ttctl status --json` and
//! `ttctl top`.

use std::collections::{BTreeMap, BTreeSet};
use tt_serving_proto::v1 as pb;
use tt_serving_tests::chaos_support::{scrape, Scrape};
use tt_serving_tests::{output_text, tiny_model, wait_until, Daemon, DaemonOptions, FakeHw};

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Runtime::new().expect("tokio runtime")
}

/// Model `m` with two replicas on cards 0 and 1; `extra` lines go inside
/// its table.
fn start(hw: &FakeHw, model: &std::path::Path, extra: &str) -> Daemon {
    let daemon = Daemon::start(
        hw,
        DaemonOptions {
            extra: format!(
                "\n[models.m]\ntp = 1\nreplicas = [[\"{}\"], [\"{}\"]]\ncheckpoint = \"{}\"\nworker = [\"{}\"]\ndrain_timeout_secs = 5\n{extra}\n",
                FakeHw::bdf(0),
                FakeHw::bdf(1),
                model.display(),
                tt_serving_tests::bin("tt-worker").display()
            ),
            ..Default::default()
        },
    );
    daemon.wait_slot_state("m/0", "ready");
    daemon.wait_slot_state("m/1", "ready");
    daemon
}

/// One finished request: the reply's text, the serving slot, its usage and
/// how many of its prompt tokens the engine's prefix cache supplied.
#[derive(Debug, Clone)]
struct Reply {
    text: String,
    slot: String,
    prompt_tokens: u32,
    cached_prompt_tokens: u32,
}

async fn generate(
    address: &str,
    input: pb::generate_request::Input,
) -> Result<Reply, tonic::Status> {
    use pb::generate_response::Chunk;
    let mut client = pb::inference_client::InferenceClient::connect(format!("http://{address}"))
        .await
        .map_err(|e| tonic::Status::unavailable(format!("connect: {e}")))?;
    let mut stream = client
        .generate(pb::GenerateRequest {
            model: "m".into(),
            input: Some(input),
            max_tokens: 6,
            ..Default::default()
        })
        .await?
        .into_inner();
    let mut text = String::new();
    while let Some(chunk) = stream.message().await? {
        match chunk.chunk {
            Some(Chunk::Delta(d)) => text.push_str(&d.text),
            Some(Chunk::Final(f)) => {
                return Ok(Reply {
                    text,
                    slot: f.slot,
                    prompt_tokens: f.usage.map_or(0, |u| u.prompt_tokens),
                    cached_prompt_tokens: f.timings.map_or(0, |t| t.cached_prompt_tokens),
                })
            }
            _ => {}
        }
    }
    Err(tonic::Status::internal(
        "stream ended without a final chunk",
    ))
}

/// A chat conversation as a client keeps it: the system prompt, the
/// first question, then each answer and the next question appended.
struct Conversation {
    messages: Vec<pb::ChatMessage>,
    /// The slot of each turn so far.
    slots: Vec<String>,
}

impl Conversation {
    fn new(topic: usize) -> Conversation {
        let message = |role: &str, content: String| pb::ChatMessage {
            role: role.into(),
            content,
        };
        Conversation {
            messages: vec![
                message("system", "You are a terse assistant.".into()),
                message("user", format!("Tell me about topic number {topic}.")),
            ],
            slots: Vec::new(),
        }
    }

    /// Send the conversation so far; append the answer and a follow-up.
    async fn turn(&mut self, address: &str) -> Result<Reply, tonic::Status> {
        let input = pb::generate_request::Input::Chat(pb::ChatMessages {
            messages: self.messages.clone(),
        });
        let reply = generate(address, input).await?;
        self.slots.push(reply.slot.clone());
        self.messages.push(pb::ChatMessage {
            role: "assistant".into(),
            content: reply.text.clone(),
        });
        self.messages.push(pb::ChatMessage {
            role: "user".into(),
            content: format!("And then? (turn {})", self.slots.len() + 1),
        });
        Ok(reply)
    }

    /// The one slot that served every turn.
    fn slot(&self) -> &str {
        let first = &self.slots[0];
        assert!(
            self.slots.iter().all(|s| s == first),
            "one conversation's turns were served by {:?}",
            self.slots
        );
        first
    }
}

fn affinity(scrape: &Scrape, slot: &str, outcome: &str) -> f64 {
    scrape.sum(
        "tt_serving_affinity_routed_total",
        &[("model", "m"), ("slot", slot), ("outcome", outcome)],
    )
}

#[test]
fn a_conversation_stays_on_one_replica_while_other_conversations_use_the_other() {
    let hw = FakeHw::new(2);
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path());
    let daemon = start(&hw, &model, "");
    let address = daemon.inference_address();
    let rt = runtime();

    let mut conversations: Vec<Conversation> = (0..12).map(Conversation::new).collect();
    let mut prompt_tokens: BTreeMap<String, u64> = BTreeMap::new();
    let mut cached_tokens: BTreeMap<String, u64> = BTreeMap::new();
    // Turns interleave across conversations, as many clients' would.
    for _ in 0..3 {
        for c in &mut conversations {
            let reply = rt.block_on(c.turn(&address)).expect("every turn is served");
            *prompt_tokens.entry(reply.slot.clone()).or_default() += u64::from(reply.prompt_tokens);
            *cached_tokens.entry(reply.slot).or_default() += u64::from(reply.cached_prompt_tokens);
        }
    }
    let mut by_slot: BTreeMap<&str, usize> = BTreeMap::new();
    for c in &conversations {
        *by_slot.entry(c.slot()).or_default() += 1;
    }
    // Both replicas serve: conversations spread by their leading messages.
    assert_eq!(
        by_slot.keys().copied().collect::<Vec<_>>(),
        vec!["m/0", "m/1"],
        "{by_slot:?}"
    );

    // The operator sees it in the metrics: every request went to its
    // key's replica (one at a time, so none over the load bound), and each
    // slot's prompt tokens and the share its prefix cache supplied.
    let metrics = scrape(&daemon);
    for slot in ["m/0", "m/1"] {
        let turns = 3.0 * by_slot[slot] as f64;
        assert_eq!(affinity(&metrics, slot, "affine"), turns, "{slot}");
        assert_eq!(affinity(&metrics, slot, "fallback"), 0.0, "{slot}");
        assert_eq!(
            metrics.sum(
                "tt_serving_prefix_cache_queries_total",
                &[("model", "m"), ("slot", slot)]
            ),
            prompt_tokens[slot] as f64,
            "{slot}"
        );
        // tt-worker's prefix cache supplies the part of each later turn
        // that the replica computed for the earlier ones: that is what
        // keeping a conversation on one replica is for.
        assert!(cached_tokens[slot] > 0, "{slot}: {cached_tokens:?}");
        assert_eq!(
            metrics.get(&format!(
                "tt_serving_prefix_cache_hits_total{{slot=\"{slot}\",model=\"m\"}}"
            )),
            Some(cached_tokens[slot] as f64),
            "{}",
            metrics.text
        );
    }
}

/// The cell under `header` in the row of `slot` of a `ttctl top` frame.
fn top_cell(frame: &str, slot: &str, header: &str) -> String {
    let head = frame
        .lines()
        .find(|l| l.starts_with("SLOT "))
        .unwrap_or_else(|| panic!("no header in {frame}"));
    let row = frame
        .lines()
        .find(|l| l.starts_with(&format!("{slot} ")))
        .unwrap_or_else(|| panic!("no row for {slot} in {frame}"));
    let column = head
        .find(&format!("  {header}  "))
        .unwrap_or_else(|| panic!("no {header} column in {frame}"))
        + 2;
    row.get(column..)
        .and_then(|rest| rest.split("  ").next())
        .unwrap_or_default()
        .trim()
        .to_string()
}

#[test]
fn status_and_top_show_a_conversations_prefix_cache_hits_and_kv_memory() {
    let hw = FakeHw::new(2);
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path());
    let daemon = start(&hw, &model, "");
    let address = daemon.inference_address();
    let rt = runtime();

    let mut conversation = Conversation::new(0);
    let first = rt.block_on(conversation.turn(&address)).expect("turn 1");
    let second = rt.block_on(conversation.turn(&address)).expect("turn 2");
    let home = conversation.slot().to_string();
    let other = if home == "m/0" { "m/1" } else { "m/0" };
    assert_eq!(first.cached_prompt_tokens, 0, "nothing to reuse yet");
    assert!(
        second.cached_prompt_tokens > 0,
        "the second turn reuses the first: {second:?}"
    );

    // `ttctl status --json`: the slot's counters are its final chunks'
    // usage and timings, and its engine's KV memory is there while Ready.
    let status = daemon.slot(&home);
    let prompt = u64::from(first.prompt_tokens + second.prompt_tokens);
    let cached = u64::from(second.cached_prompt_tokens);
    assert_eq!(status["prompt_tokens"], prompt, "{status}");
    assert_eq!(status["cached_prompt_tokens"], cached, "{status}");
    assert_eq!(status["affinity_affine"], 2, "{status}");
    assert_eq!(status["affinity_fallback"], 0, "{status}");
    let kv = &status["kv"];
    assert!(kv["blocks_total"].as_u64().unwrap_or(0) > 0, "{status}");
    assert!(kv["block_tokens"].as_u64().unwrap_or(0) > 0, "{status}");
    assert!(kv["budget_bytes"].as_u64().unwrap_or(0) > 0, "{status}");
    assert_eq!(kv["prefix_cache"], true, "{status}");
    let idle = daemon.slot(other);
    assert_eq!(idle["prompt_tokens"], 0, "{idle}");
    assert!(
        idle["kv"]["blocks_total"].as_u64().unwrap_or(0) > 0,
        "{idle}"
    );

    // `ttctl status` shows the running hit rate in its slots table.
    let hit = format!("{:.0}%", cached as f64 * 100.0 / prompt as f64);
    let out = daemon.ttctl(&["status"]);
    assert!(out.status.success(), "{}", output_text(&out));
    let table = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(table.contains("  HIT  "), "{table}");
    let row = table
        .lines()
        .find(|l| l.starts_with(&format!("{home} ")))
        .unwrap_or_default();
    assert!(row.contains(&format!("  {hit}  ")), "{table}");

    // `ttctl top`: no request between its two frames, so HIT is the
    // running total in both; the slot without a request has none; KV is a
    // share of each engine's blocks.
    let out = daemon.ttctl(&["top", "--iterations", "2", "--interval", "0.5"]);
    assert!(out.status.success(), "{}", output_text(&out));
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let frames: Vec<&str> = text.split("\n\n").filter(|f| f.contains("SLOT")).collect();
    assert_eq!(frames.len(), 2, "{text}");
    for frame in frames {
        assert_eq!(top_cell(frame, &home, "HIT"), hit, "{text}");
        assert_eq!(top_cell(frame, other, "HIT"), "-", "{text}");
        for slot in [home.as_str(), other] {
            assert!(top_cell(frame, slot, "KV").ends_with('%'), "{text}");
        }
    }
}

#[test]
fn with_prefix_affinity_off_the_least_loaded_replica_takes_each_request() {
    let hw = FakeHw::new(2);
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path());
    let daemon = start(&hw, &model, "prefix_affinity = false");
    let address = daemon.inference_address();
    let rt = runtime();
    // One request at a time: both replicas are idle each time, and the
    // first of equals (in name order) takes it, whatever the conversation.
    let mut conversations: Vec<Conversation> = (0..6).map(Conversation::new).collect();
    for c in &mut conversations {
        // The last answer's stream has ended at the daemon too.
        wait_until("both replicas idle", || {
            ["m/0", "m/1"]
                .iter()
                .all(|s| daemon.slot(s)["requests_in_flight"].as_u64().unwrap_or(0) == 0)
                .then_some(())
        });
        rt.block_on(c.turn(&address)).expect("served");
        assert_eq!(c.slot(), "m/0");
    }
    let metrics = scrape(&daemon);
    assert!(
        !metrics.text.contains("tt_serving_affinity_routed_total{"),
        "{}",
        metrics.text
    );
}

#[test]
fn one_hot_prompt_spreads_over_both_replicas_within_the_load_bound() {
    let hw = FakeHw::new(2);
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path());
    // Each prefill takes a second, so the requests below all overlap.
    let daemon = start(
        &hw,
        &model,
        "env = { TTW_TEST_FAULTS = \"1\", TTW_FAULT_PREFILL_STALL_MS = \"1000\" }",
    );
    let address = daemon.inference_address();
    let rt = runtime();
    let replies: Vec<Reply> = rt.block_on(async {
        let requests: Vec<_> = (0..8)
            .map(|_| {
                let address = address.clone();
                tokio::spawn(async move {
                    generate(
                        &address,
                        pb::generate_request::Input::Prompt(
                            "The same long system prompt, sent by every client.".into(),
                        ),
                    )
                    .await
                })
            })
            .collect();
        let mut replies = Vec::new();
        for r in requests {
            replies.push(r.await.expect("task").expect("every request is served"));
        }
        replies
    });
    let mut by_slot: BTreeMap<String, usize> = BTreeMap::new();
    for r in &replies {
        *by_slot.entry(r.slot.clone()).or_default() += 1;
    }
    // Eight at once with one key: its replica takes up to a quarter above
    // the average (5 of 8), the other the rest; never all eight on one.
    assert_eq!(by_slot.len(), 2, "{by_slot:?}");
    let metrics = scrape(&daemon);
    let fallback: f64 = ["m/0", "m/1"]
        .iter()
        .map(|s| affinity(&metrics, s, "fallback"))
        .sum();
    let affine: f64 = ["m/0", "m/1"]
        .iter()
        .map(|s| affinity(&metrics, s, "affine"))
        .sum();
    eprintln!("one hot prompt, eight at once: {by_slot:?}; {affine} affine, {fallback} fallback");
    assert_eq!(affine + fallback, 8.0, "{}", metrics.text);
    assert!(fallback >= 1.0, "none spilled over the bound: {by_slot:?}");
    assert!(
        affine >= fallback,
        "the key's own replica took most: {by_slot:?}"
    );
}

#[test]
fn a_replica_going_away_hands_its_conversations_to_the_survivor_without_errors() {
    let hw = FakeHw::new(2);
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path());
    let daemon = start(&hw, &model, "[models.m.restart]\nbackoff_ms = 50\n");
    let address = daemon.inference_address();
    let rt = runtime();

    let mut conversations: Vec<Conversation> = (0..8).map(Conversation::new).collect();
    for c in &mut conversations {
        rt.block_on(c.turn(&address)).expect("first turn");
    }
    let homes: Vec<String> = conversations.iter().map(|c| c.slot().to_string()).collect();
    let lost = homes[0].clone();
    let survivor = if lost == "m/0" { "m/1" } else { "m/0" };
    assert!(homes.iter().any(|h| h == survivor), "{homes:?}");

    // The replica of the first conversation dies (its worker killed); once
    // the daemon has taken it out of routing, every conversation goes on,
    // its own and the others, on the survivor.
    let first = daemon.slot(&lost);
    let pid = first["worker_pid"].as_i64().expect("worker pid") as i32;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("kill the worker");
    wait_until("the killed replica to leave Ready", || {
        (daemon.slot(&lost)["state"] != "ready").then_some(())
    });
    for c in &mut conversations {
        let reply = rt
            .block_on(c.turn(&address))
            .expect("a turn while one replica is gone");
        assert_eq!(reply.slot, survivor);
    }

    // Back Ready, the replica takes its own conversations back (the mapping
    // depends only on which replicas are Ready); the others stay put.
    wait_until("the replica to come back", || {
        let slot = daemon.slot(&lost);
        (slot["state"] == "ready" && slot["worker_pid"] != first["worker_pid"]).then_some(())
    });
    for (c, home) in conversations.iter_mut().zip(&homes) {
        let reply = rt
            .block_on(c.turn(&address))
            .expect("a turn after the return");
        assert_eq!(&reply.slot, home);
    }
    let served: BTreeSet<&str> = conversations
        .iter()
        .flat_map(|c| c.slots.iter().map(String::as_str))
        .collect();
    assert_eq!(served.len(), 2);
}
