//! Usage per API key (#45), end to end: two named keys send at once over
//! the OpenAI door, each client sums the `usage` of its answers, and the
//! daemon's ledger (`ttctl usage --json`) and counters
//! (`tt_serving_key_*_total`) agree with each client, across a clean
//! restart and a kill -9 (nothing counted twice); the gRPC door counts
//! under the same names, refusals included.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use tt_serving_tests::{
    curl, model_table, output_text, tiny_model, wait_until, Daemon, DaemonOptions, FakeHw,
};

/// Two named keys and one bare token (named from its digest).
const KEYS: [(&str, &str); 2] = [
    ("sk-usage-alpha-0001", "team-a"),
    ("sk-usage-beta-0002", "team-b"),
];

/// What a client counted from its answers' `usage`.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Sums {
    requests: u64,
    prompt: u64,
    cached: u64,
    completion: u64,
    refused: u64,
}

fn options(dir: &Path) -> DaemonOptions {
    use std::os::unix::fs::PermissionsExt;
    let tokens = dir.join("tokens");
    let text: String = KEYS
        .iter()
        .map(|(token, name)| format!("{token} {name}\n"))
        .collect();
    std::fs::write(&tokens, format!("# clients\n{text}")).expect("write tokens");
    std::fs::set_permissions(&tokens, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let model = tiny_model(dir);
    DaemonOptions {
        extra: format!(
            "[openai]\nlisten = \"127.0.0.1:0\"\n\n[inference]\ntokens_file = \"{}\"\n\n{}",
            tokens.display(),
            model_table("smol", 1, &[0], &model, "")
        ),
        ..Default::default()
    }
}

fn base(daemon: &Daemon) -> String {
    let address = daemon.status()["daemon"]["openai_address"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(!address.is_empty(), "no openai_address in status");
    format!("http://{address}")
}

/// `n` completions with `token`, summed as the client sees them.
fn send(base: &str, token: &str, n: usize, seed: usize) -> Sums {
    let mut sums = Sums::default();
    for i in 0..n {
        let body = format!(
            r#"{{"model":"smol","prompt":"request {seed} {i} of a usage test","max_tokens":{}}}"#,
            2 + (i % 4)
        );
        let answer = curl(
            "POST",
            &format!("{base}/v1/completions"),
            Some(token),
            Some(&body),
        );
        assert_eq!(answer.status, 200, "{answer:?}");
        let usage = &answer.json()["usage"];
        sums.requests += 1;
        sums.prompt += usage["prompt_tokens"].as_u64().unwrap_or(0);
        sums.completion += usage["completion_tokens"].as_u64().unwrap_or(0);
        sums.cached += usage["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap_or(0);
    }
    sums
}

/// Both keys at once.
fn send_both(daemon: &Daemon, n: usize, seed: usize) -> BTreeMap<&'static str, Sums> {
    let base = base(daemon);
    std::thread::scope(|s| {
        let handles: Vec<_> = KEYS
            .iter()
            .map(|(token, name)| {
                let base = base.clone();
                (*name, s.spawn(move || send(&base, token, n, seed)))
            })
            .collect();
        handles
            .into_iter()
            .map(|(name, h)| (name, h.join().expect("client thread")))
            .collect()
    })
}

/// The ledger's sums of `key`, as `ttctl usage --json --key` prints them.
fn ledger(daemon: &Daemon, key: &str) -> Sums {
    let out = daemon.ttctl(&["usage", "--json", "--key", key]);
    assert!(out.status.success(), "ttctl usage: {}", output_text(&out));
    let mut sums = Sums::default();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let u: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
        assert_eq!(u["key"], key, "{u}");
        sums.requests += u["requests"].as_u64().unwrap_or(0);
        sums.prompt += u["prompt_tokens"].as_u64().unwrap_or(0);
        sums.cached += u["cached_prompt_tokens"].as_u64().unwrap_or(0);
        sums.completion += u["completion_tokens"].as_u64().unwrap_or(0);
        sums.refused += u["refused"].as_u64().unwrap_or(0);
    }
    sums
}

/// Wait until the ledger (flushed every 2 s) holds what the clients counted.
fn ledger_matches(daemon: &Daemon, expected: &BTreeMap<&str, Sums>) {
    for (key, want) in expected {
        let got = wait_until(&format!("the ledger of {key} to reach {want:?}"), || {
            let got = ledger(daemon, key);
            (got == *want || got.requests > want.requests).then_some(got)
        });
        assert_eq!(got, *want, "ledger of {key}");
    }
}

fn scrape(daemon: &Daemon) -> String {
    let address = daemon.status()["daemon"]["metrics_address"]
        .as_str()
        .expect("metrics address in status")
        .to_string();
    let mut stream = TcpStream::connect(&address).expect("connect to the metrics endpoint");
    write!(
        stream,
        "GET /metrics HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n"
    )
    .expect("send request");
    let mut response = String::new();
    stream.read_to_string(&mut response).expect("read response");
    response
}

/// A counter's value in a scrape (0 when absent).
fn counter(scrape: &str, series: &str) -> u64 {
    scrape
        .lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse::<f64>().ok())
        .map_or(0, |v| v as u64)
}

fn add(a: &mut BTreeMap<&'static str, Sums>, b: &BTreeMap<&'static str, Sums>) {
    for (k, s) in b {
        let t = a.entry(k).or_default();
        t.requests += s.requests;
        t.prompt += s.prompt;
        t.cached += s.cached;
        t.completion += s.completion;
        t.refused += s.refused;
    }
}

/// `n` generations over gRPC with `token`, then one for a model that does
/// not exist (refused), summed as the client sees them.
fn send_grpc(daemon: &Daemon, token: &str, n: usize) -> Sums {
    use tt_serving_proto::v1::inference_client::InferenceClient;
    use tt_serving_proto::v1::{
        generate_request::Input, generate_response::Chunk, GenerateRequest,
    };
    let address = daemon.inference_address();
    let request = |model: &str, i: usize| {
        let mut r = tonic::Request::new(GenerateRequest {
            model: model.into(),
            input: Some(Input::Prompt(format!("grpc request {i}"))),
            max_tokens: 3,
            ..Default::default()
        });
        r.metadata_mut().insert(
            "authorization",
            format!("Bearer {token}").parse().expect("ASCII token"),
        );
        r
    };
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async {
        let mut client = InferenceClient::connect(format!("http://{address}"))
            .await
            .expect("connect to the inference port");
        let mut sums = Sums::default();
        for i in 0..n {
            let mut stream = client
                .generate(request("smol", i))
                .await
                .expect("generate")
                .into_inner();
            while let Some(chunk) = stream.message().await.expect("chunk") {
                if let Some(Chunk::Final(f)) = chunk.chunk {
                    let usage = f.usage.unwrap_or_default();
                    sums.requests += 1;
                    sums.prompt += u64::from(usage.prompt_tokens);
                    sums.completion += u64::from(usage.completion_tokens);
                    sums.cached += u64::from(
                        f.timings
                            .map_or(0, |t| t.cached_prompt_tokens)
                            .min(usage.prompt_tokens),
                    );
                }
            }
        }
        let refused = client.generate(request("no-such-model", n)).await;
        assert!(refused.is_err(), "an unknown model was served");
        sums.requests += 1;
        sums.refused += 1;
        sums
    })
}

#[test]
fn two_keys_at_once_are_counted_apart_across_restarts() {
    let hw = FakeHw::new(1);
    let dir = tempfile::tempdir().unwrap();
    let opts = options(dir.path());
    let extra = opts.extra.clone();
    let mut daemon = Daemon::start(&hw, opts);
    daemon.wait_slot_state("smol", "ready");

    let mut total = send_both(&daemon, 6, 0);
    ledger_matches(&daemon, &total);

    // The counters of this daemon's life agree with the clients.
    let scraped = scrape(&daemon);
    for (key, s) in &total {
        let series = |name: &str, rest: &str| {
            format!("tt_serving_{name}{{key=\"{key}\",model=\"smol\",{rest}}}")
        };
        assert_eq!(
            counter(&scraped, &series("key_requests_total", "outcome=\"ok\"")),
            s.requests,
            "{scraped}"
        );
        assert_eq!(
            counter(&scraped, &series("key_tokens_total", "kind=\"prompt\"")),
            s.prompt
        );
        assert_eq!(
            counter(
                &scraped,
                &series("key_tokens_total", "kind=\"cached_prompt\"")
            ),
            s.cached
        );
        assert_eq!(
            counter(&scraped, &series("key_tokens_total", "kind=\"completion\"")),
            s.completion
        );
    }
    // Names, never tokens.
    for (token, _) in KEYS {
        assert!(!scraped.contains(token));
    }

    // The gRPC door counts under the same names.
    let grpc = BTreeMap::from([("team-a", send_grpc(&daemon, KEYS[0].0, 3))]);
    add(&mut total, &grpc);
    ledger_matches(&daemon, &total);

    // A clean restart: the ledger keeps what was counted, once.
    daemon.restart_with(&hw, extra.clone());
    daemon.wait_slot_state("smol", "ready");
    add(&mut total, &send_both(&daemon, 4, 1));
    ledger_matches(&daemon, &total);

    // kill -9 after the flush window: nothing lost, nothing counted twice.
    daemon.kill9();
    daemon.restart_with(&hw, extra.clone());
    daemon.wait_slot_state("smol", "ready");
    for (key, want) in &total {
        assert_eq!(ledger(&daemon, key), *want, "after kill -9, {key}");
    }

    // kill -9 inside the window: what was flushed stays, the rest (at most
    // the last 2 s) is lost, nothing is counted twice.
    let flushed = total.clone();
    add(&mut total, &send_both(&daemon, 2, 2));
    daemon.kill9();
    daemon.restart_with(&hw, extra);
    daemon.wait_slot_state("smol", "ready");
    for (key, most) in &total {
        let got = ledger(&daemon, key);
        let least = flushed[key];
        assert!(
            got.requests >= least.requests && got.requests <= most.requests,
            "{key}: {got:?} outside {least:?}..={most:?}"
        );
        assert!(got.completion >= least.completion && got.completion <= most.completion);
    }

    // The table names both keys.
    let out = daemon.ttctl(&["usage"]);
    let text = output_text(&out);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("team-a") && text.contains("team-b"), "{text}");
}

/// `curl` a completion with `token` and extra headers: the HTTP status.
fn post_raw(base: &str, token: &str, headers: &[&str], body: &str) -> u16 {
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("body");
    std::fs::write(&file, body).expect("write body");
    let mut cmd = std::process::Command::new("curl");
    cmd.args(["-sS", "-o", "/dev/null", "-w", "%{http_code}", "--http1.1"])
        .args(["--max-time", "60", "-X", "POST", "-H", "Expect:"])
        .args(["-H", &format!("Authorization: Bearer {token}")])
        .args(["-H", "Content-Type: application/json"]);
    for header in headers {
        cmd.args(["-H", header]);
    }
    let out = cmd
        .arg("--data-binary")
        .arg(format!("@{}", file.display()))
        .arg(format!("{base}/v1/completions"))
        .output()
        .expect("run curl");
    assert!(out.status.success(), "curl: {}", output_text(&out));
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .unwrap_or_else(|e| panic!("{e}: {}", output_text(&out)))
}

#[test]
fn refusals_before_routing_count_under_the_key_once() {
    let hw = FakeHw::new(1);
    let dir = tempfile::tempdir().unwrap();
    let mut opts = options(dir.path());
    opts.extra.push_str("\n[limits]\nmax_prompt_bytes = 4096\n");
    let daemon = Daemon::start(&hw, opts);
    daemon.wait_slot_state("smol", "ready");
    let base = base(&daemon);
    let (token, key) = KEYS[0];

    // The OpenAI door: a field of the wrong type, a body that is not JSON,
    // a malformed deadline header, a body over the size limit, and a bad
    // field naming a model that is not configured.
    let bad_field = r#"{"model":"smol","prompt":"x","max_tokens":"many"}"#;
    assert_eq!(post_raw(&base, token, &[], bad_field), 400);
    assert_eq!(post_raw(&base, token, &[], "this is not JSON"), 400);
    let fine = r#"{"model":"smol","prompt":"x","max_tokens":2}"#;
    assert_eq!(
        post_raw(&base, token, &["x-request-timeout-ms: soon"], fine),
        400
    );
    let huge = format!(r#"{{"model":"smol","prompt":"{}"}}"#, "a".repeat(2 << 20));
    assert_eq!(post_raw(&base, token, &[], &huge), 413);
    let unknown = r#"{"model":"not-configured","prompt":"x","max_tokens":"many"}"#;
    assert_eq!(post_raw(&base, token, &[], unknown), 400);
    // A wrong token has no key: not counted at all.
    assert_eq!(post_raw(&base, "sk-wrong-token", &[], bad_field), 401);

    // The gRPC door: a message over the size limit, refused from its
    // length prefix before it is read.
    {
        use tt_serving_proto::v1::inference_client::InferenceClient;
        use tt_serving_proto::v1::{generate_request::Input, GenerateRequest};
        let address = daemon.inference_address();
        let runtime = tokio::runtime::Runtime::new().expect("runtime");
        runtime.block_on(async {
            let mut client = InferenceClient::connect(format!("http://{address}"))
                .await
                .expect("connect to the inference port");
            let mut request = tonic::Request::new(GenerateRequest {
                model: "smol".into(),
                input: Some(Input::Prompt("x".repeat(2 << 20))),
                max_tokens: 2,
                ..Default::default()
            });
            request.metadata_mut().insert(
                "authorization",
                format!("Bearer {token}").parse().expect("ASCII token"),
            );
            let err = client.generate(request).await.expect_err("a 2 MB message");
            assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err}");
        });
    }

    // Each refusal once, under the key; the model only when configured.
    let scraped = scrape(&daemon);
    let invalid = |model: &str| {
        counter(
            &scraped,
            &format!(
                "tt_serving_key_requests_total{{key=\"{key}\",model=\"{model}\",outcome=\"invalid\"}}"
            ),
        )
    };
    assert_eq!(invalid("smol"), 2, "{scraped}");
    assert_eq!(invalid(""), 4, "{scraped}");
    assert!(!scraped.contains("not-configured"), "{scraped}");
    let all_keys: u64 = scraped
        .lines()
        .filter(|l| l.starts_with("tt_serving_key_requests_total{") && l.contains("\"invalid\""))
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .map(|v| v as u64)
        .sum();
    assert_eq!(all_keys, 6, "the 401 is no key's: {scraped}");
    let by_model = |model: &str| {
        counter(
            &scraped,
            &format!("tt_serving_requests_total{{model=\"{model}\",outcome=\"invalid\"}}"),
        )
    };
    assert_eq!((by_model("smol"), by_model("")), (2, 4), "{scraped}");

    // The ledger (flushed every 2 s) has them as refusals of the key.
    let want = Sums {
        requests: 6,
        refused: 6,
        ..Sums::default()
    };
    ledger_matches(&daemon, &BTreeMap::from([(key, want)]));
    assert_eq!(ledger(&daemon, KEYS[1].1), Sums::default());
}
