//! Operating signals end to end: `/metrics` scraped over real HTTP from a
//! real daemon with real workers on fake cards, in both its formats and
//! through Prometheus's own linter (`promtool check metrics`), and `ttctl
//! top`.

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use tonic::Code;
use tt_serving_tests::chaos_support::PROMETHEUS_ACCEPT;
use tt_serving_tests::{
    generate, model_table, output_text, tiny_model, wait_until, Daemon, DaemonOptions, FakeHw,
};

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Runtime::new().expect("tokio runtime")
}

/// GET `path` from the daemon's metrics endpoint as `curl` does (no
/// `Accept`): status line, headers and body as one text.
fn http_get(daemon: &Daemon, path: &str) -> String {
    http_get_with(daemon, path, None)
}

/// GET `path` with `accept` as the `Accept` header.
fn http_get_with(daemon: &Daemon, path: &str, accept: Option<&str>) -> String {
    let address = daemon.status()["daemon"]["metrics_address"]
        .as_str()
        .expect("metrics address in status")
        .to_string();
    let mut stream = TcpStream::connect(&address).expect("connect to the metrics endpoint");
    let accept = accept
        .map(|a| format!("Accept: {a}\r\n"))
        .unwrap_or_default();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {address}\r\n{accept}Connection: close\r\n\r\n"
    )
    .expect("send request");
    let mut response = String::new();
    stream.read_to_string(&mut response).expect("read response");
    response
}

/// The value of the sample whose line starts with `series ` (exact labels).
fn sample(scrape: &str, series: &str) -> Option<f64> {
    scrape
        .lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
}

#[test]
fn metrics_count_requests_tokens_latency_states_restarts_resets_and_builds() {
    let hw = FakeHw::new(2);
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path());
    let extra = "[models.m.restart]\nbackoff_ms = 50\n";
    let daemon = Daemon::start(
        &hw,
        DaemonOptions {
            extra: model_table("m", 1, &[0], &model, extra),
            ..Default::default()
        },
    );
    let first = daemon.wait_slot_state("m", "ready");
    let address = daemon.inference_address();
    let rt = runtime();
    let mut generated = 0;
    for _ in 0..2 {
        let answer = rt
            .block_on(generate(&address, "m", "hello world", 6))
            .expect("answered");
        generated += answer.last.usage.map(|u| u.completion_tokens).unwrap_or(0);
    }
    let err = rt
        .block_on(generate(&address, "nope", "hello", 4))
        .expect_err("unknown model");
    assert_eq!(err.code(), Code::NotFound);

    // A worker killed from outside, and a reset of the spare card.
    let pid = first["worker_pid"].as_u64().unwrap_or(0) as i32;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("kill the worker");
    wait_until("the slot to come back", || {
        let slot = daemon.slot("m");
        (slot["state"] == "ready" && slot["worker_pid"] != first["worker_pid"]).then_some(())
    });
    let reset = daemon.ttctl(&["card", "reset", "1"]);
    assert!(reset.status.success(), "{}", output_text(&reset));

    // As Prometheus scrapes it: OpenMetrics.
    let response = http_get_with(&daemon, "/metrics", Some(PROMETHEUS_ACCEPT));
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    assert!(
        response.contains("application/openmetrics-text"),
        "{response}"
    );
    let m = "model=\"m\"";
    let expect = |series: &str, value: f64| {
        assert_eq!(
            sample(&response, series),
            Some(value),
            "{series} in\n{response}"
        );
    };
    expect(
        &format!("tt_serving_requests_total{{{m},outcome=\"ok\"}}"),
        2.0,
    );
    expect(
        "tt_serving_requests_total{model=\"\",outcome=\"unknown_model\"}",
        1.0,
    );
    expect(
        &format!("tt_serving_generation_tokens_total{{{m}}}"),
        f64::from(generated),
    );
    expect(
        &format!("tt_serving_time_to_first_token_seconds_count{{{m}}}"),
        2.0,
    );
    expect(
        &format!("tt_serving_e2e_request_latency_seconds_count{{{m}}}"),
        2.0,
    );
    expect(
        &format!("tt_serving_slot_state{{slot=\"m\",{m},state=\"ready\"}}"),
        1.0,
    );
    expect(
        &format!("tt_serving_slot_state{{slot=\"m\",{m},state=\"failed\"}}"),
        0.0,
    );
    expect(
        &format!("tt_serving_worker_restarts_total{{slot=\"m\",{m},cause=\"signal\"}}"),
        1.0,
    );
    // The first start built the cache cold; the restart after the kill
    // was warm.
    expect(
        &format!("tt_serving_slot_starts_total{{slot=\"m\",{m},mode=\"cold\"}}"),
        1.0,
    );
    expect(
        &format!("tt_serving_slot_starts_total{{slot=\"m\",{m},mode=\"warm\"}}"),
        1.0,
    );
    expect(
        &format!("tt_serving_cache_builds_total{{{m},outcome=\"ok\"}}"),
        1.0,
    );
    // Card 0 was reset after the unclean exit, card 1 by hand.
    for card in [FakeHw::bdf(0), FakeHw::bdf(1)] {
        expect(
            &format!("tt_serving_card_resets_total{{card=\"{card}\",outcome=\"proven\"}}"),
            1.0,
        );
        expect(
            &format!("tt_serving_card_reset_duration_seconds_count{{card=\"{card}\"}}"),
            1.0,
        );
        let temperature = sample(
            &response,
            &format!("tt_serving_card_temperature_celsius{{card=\"{card}\"}}"),
        );
        assert!(temperature.is_some_and(|t| t > 0.0), "{response}");
    }
    assert!(
        sample(
            &response,
            &format!("tt_serving_worker_resident_memory_bytes{{slot=\"m\",{m}}}")
        )
        .is_some_and(|b| b > 0.0),
        "{response}"
    );
    assert!(response.trim_end().ends_with("# EOF"), "{response}");

    let missing = http_get(&daemon, "/");
    assert!(missing.starts_with("HTTP/1.1 404"), "{missing}");
    assert!(missing.contains("/metrics"), "{missing}");
}

#[test]
fn ttctl_top_shows_rates_queue_and_latency_per_slot() {
    let hw = FakeHw::new(1);
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path());
    let daemon = Daemon::start(
        &hw,
        DaemonOptions {
            extra: model_table("m", 1, &[0], &model, ""),
            ..Default::default()
        },
    );
    daemon.wait_slot_state("m", "ready");
    let address = daemon.inference_address();
    let rt = runtime();
    rt.block_on(generate(&address, "m", "hello", 8))
        .expect("answered");
    let top = std::process::Command::new(tt_serving_tests::bin("ttctl"))
        .arg("--socket")
        .arg(&daemon.socket)
        .args(["top", "--interval", "0.5", "--iterations", "2"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start ttctl top");
    // Keep the slot busy while top samples twice.
    let busy = rt.spawn(async move {
        for _ in 0..20 {
            let _ = generate(&address, "m", "more text please", 16).await;
        }
    });
    let out = top.wait_with_output().expect("ttctl top ends");
    rt.block_on(busy).expect("load finished");
    assert!(out.status.success(), "{}", output_text(&out));
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let frames: Vec<&str> = text.split("\n\n").filter(|f| f.contains("SLOT")).collect();
    assert_eq!(frames.len(), 2, "{text}");
    for header in ["TOK/S", "QUEUE", "TTFT p50", "ITL p50"] {
        assert!(frames[0].contains(header), "{text}");
    }
    let row = |frame: &str| -> Vec<String> {
        frame
            .lines()
            .find(|l| l.starts_with("m "))
            .unwrap_or_default()
            .split_whitespace()
            .map(str::to_string)
            .collect()
    };
    let (first, second) = (row(frames[0]), row(frames[1]));
    assert_eq!(first.get(1).map(String::as_str), Some("ready"), "{text}");
    // The queue as waiting/limit: the load runs while top samples, so one
    // request may be waiting then.
    assert!(
        first
            .get(3)
            .and_then(|q| q.strip_suffix("/64"))
            .is_some_and(|waiting| waiting.parse::<u32>().is_ok_and(|w| w <= 1)),
        "{text}"
    );
    assert_eq!(
        first.get(4).map(String::as_str),
        Some("-"),
        "no rate in the first frame: {text}"
    );
    assert!(
        second.get(4).and_then(|r| r.parse::<f64>().ok()).is_some(),
        "a rate in the second frame: {text}"
    );
    assert!(text.contains(" ms"), "a latency is shown: {text}");
}

/// The host memory the engines share, as the daemon's hardware roots show
/// it: 1 GiB hugepages reserved and free, MemTotal and MemAvailable.
#[test]
fn metrics_show_the_hosts_hugepages_and_memory() {
    let hw = FakeHw::new(1);
    let pages = hw
        .root
        .sys_root()
        .join("kernel/mm/hugepages/hugepages-1048576kB");
    std::fs::create_dir_all(&pages).unwrap();
    std::fs::write(pages.join("nr_hugepages"), "8\n").unwrap();
    std::fs::write(pages.join("free_hugepages"), "3\n").unwrap();
    std::fs::write(
        hw.root.proc_root().join("meminfo"),
        "MemTotal:       15728640 kB\nMemFree:         100 kB\nMemAvailable:    2097152 kB\n",
    )
    .unwrap();
    let daemon = Daemon::start(&hw, DaemonOptions::default());
    let scrape = http_get(&daemon, "/metrics");
    assert_eq!(
        sample(&scrape, "tt_serving_host_hugepages_1g{state=\"total\"}"),
        Some(8.0),
        "{scrape}"
    );
    assert_eq!(
        sample(&scrape, "tt_serving_host_hugepages_1g{state=\"free\"}"),
        Some(3.0)
    );
    assert_eq!(
        sample(&scrape, "tt_serving_host_memory_bytes{kind=\"available\"}"),
        Some(2097152.0 * 1024.0)
    );
    assert_eq!(
        sample(&scrape, "tt_serving_host_memory_bytes{kind=\"total\"}"),
        Some(15728640.0 * 1024.0)
    );
}

/// Prometheus's `promtool` (Debian's `prometheus` package), or None:
/// skipped loudly; CI installs it and requires it.
fn promtool() -> Option<PathBuf> {
    let found = Command::new("promtool")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if found {
        return Some("promtool".into());
    }
    if std::env::var_os("CI").is_some() {
        panic!("CI must provide promtool: .ci/run installs the Debian package prometheus");
    }
    eprintln!(
        "SKIPPED: the promtool checks: promtool is not installed (apt-get install prometheus)"
    );
    None
}

/// `promtool check metrics` on `page` (what `curl -s .../metrics |
/// promtool check metrics` does): its exit status and what it printed.
fn promtool_check(promtool: &PathBuf, page: &str) -> (bool, String) {
    let mut child = Command::new(promtool)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start promtool");
    child
        .stdin
        .take()
        .expect("promtool's stdin")
        .write_all(page.as_bytes())
        .expect("write the page to promtool");
    let out = child.wait_with_output().expect("promtool ends");
    (out.status.success(), output_text(&out))
}

/// The body of a response, and its `Content-Type`.
fn body_and_type(response: &str) -> (String, String) {
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((response, ""));
    let content_type = head
        .lines()
        .find_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.eq_ignore_ascii_case("content-type")
                .then(|| value.trim().to_string())
        })
        .unwrap_or_default();
    (body.to_string(), content_type)
}

/// `(name, type)` of each `# TYPE` line, and the names with a `# HELP`.
fn metadata(page: &str) -> (BTreeSet<(String, String)>, BTreeSet<String>) {
    let mut typed = BTreeSet::new();
    let mut helped = BTreeSet::new();
    for line in page.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            helped.insert(rest.split(' ').next().unwrap_or("").to_string());
        } else if let Some((name, kind)) =
            line.strip_prefix("# TYPE ").and_then(|r| r.split_once(' '))
        {
            typed.insert((name.to_string(), kind.trim().to_string()));
        }
    }
    (typed, helped)
}

/// The plain page passes `promtool check metrics` and gives every family
/// its `# HELP` and `# TYPE`: `what` says when it was scraped.
fn check_plain_page(daemon: &Daemon, promtool: Option<&PathBuf>, what: &str) -> String {
    let (page, content_type) = body_and_type(&http_get(daemon, "/metrics"));
    assert_eq!(
        content_type, "text/plain; version=0.0.4; charset=utf-8",
        "{what}"
    );
    let (typed, helped) = metadata(&page);
    for (name, _) in &typed {
        assert!(
            helped.contains(name),
            "{what}: {name} has no # HELP:\n{page}"
        );
    }
    // Every sample belongs to a family a # TYPE line names.
    for line in page
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let name = line.split(['{', ' ']).next().unwrap_or("");
        let family = typed.iter().any(|(family, kind)| {
            name == family
                || (kind == "histogram"
                    && ["_bucket", "_sum", "_count"]
                        .iter()
                        .any(|suffix| name.strip_suffix(suffix) == Some(family)))
        });
        assert!(family, "{what}: `{line}` has no # TYPE of its own:\n{page}");
    }
    if let Some(promtool) = promtool {
        let (ok, printed) = promtool_check(promtool, &page);
        assert!(
            ok && printed.trim().is_empty(),
            "{what}: promtool check metrics: {printed}\npage:\n{page}"
        );
    }
    page
}

/// The metrics table of docs/METRICS.md: `(name, type)` of each row.
fn documented() -> BTreeSet<(String, String)> {
    include_str!("../docs/METRICS.md")
        .lines()
        .filter_map(|l| {
            let mut cells = l.strip_prefix("| `tt_serving_")?.split('|');
            let name = cells.next()?.trim().trim_end_matches('`');
            let kind = cells.next()?.trim();
            Some((format!("tt_serving_{name}"), kind.to_string()))
        })
        .collect()
}

/// The page `curl -s .../metrics | promtool check metrics` lints, from a
/// daemon before any request, while requests wait (the by-priority gauge
/// appears), and after it served requests, refused one for an unknown
/// model, restarted nothing but reset a card by hand and built its cache
/// cold: promtool finds nothing each time, every family has its `# HELP`
/// and `# TYPE` whether it has samples or not, and they are the families
/// and types docs/METRICS.md lists. Prometheus, which asks for
/// OpenMetrics, still gets OpenMetrics with the same families.
#[test]
fn promtool_accepts_the_page_before_requests_while_they_wait_and_after_resets_and_refusals() {
    let promtool = promtool();
    let hw = FakeHw::new(2);
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path());
    let hold = dir.path().join("hold");
    let extra = format!(
        "max_in_flight = 1\nenv = {{ TTW_TEST_FAULTS = \"1\", TTW_FAULT_HOLD_FILE = \"{}\" }}\n",
        hold.display()
    );
    let daemon = Daemon::start(
        &hw,
        DaemonOptions {
            extra: model_table("m", 1, &[0], &model, &extra),
            ..Default::default()
        },
    );
    daemon.wait_slot_state("m", "ready");

    // No request yet: the request counters have metadata and no samples.
    let page = check_plain_page(&daemon, promtool.as_ref(), "before any request");
    assert!(
        page.contains("# TYPE tt_serving_requests_total counter\n"),
        "{page}"
    );
    assert!(!page.contains("tt_serving_requests_total{"), "{page}");
    let (typed, _) = metadata(&page);
    assert_eq!(
        typed,
        documented(),
        "the families on the page (left) and in docs/METRICS.md's table (right)"
    );

    let address = daemon.inference_address();
    let rt = runtime();
    rt.block_on(generate(&address, "m", "hello world", 4))
        .expect("answered");
    let err = rt
        .block_on(generate(&address, "nope", "hello", 4))
        .expect_err("unknown model");
    assert_eq!(err.code(), Code::NotFound);
    let reset = daemon.ttctl(&["card", "reset", "1"]);
    assert!(reset.status.success(), "{}", output_text(&reset));

    // The slot held: one request running, one waiting.
    std::fs::write(&hold, "").expect("create the hold file");
    let held: Vec<_> = (0..2)
        .map(|_| {
            let address = address.clone();
            rt.spawn(async move { generate(&address, "m", "wait for me", 2).await })
        })
        .collect();
    wait_until("a request waiting", || {
        let page = http_get(&daemon, "/metrics");
        page.contains("tt_serving_num_requests_waiting_by_priority{")
            .then_some(())
    });
    let page = check_plain_page(&daemon, promtool.as_ref(), "while a request waits");
    assert!(
        page.contains("tt_serving_num_requests_waiting_by_priority{model=\"m\",priority=\"0\"} 1"),
        "{page}"
    );
    std::fs::remove_file(&hold).expect("release the hold");
    for request in held {
        rt.block_on(request)
            .expect("the request's task")
            .expect("answered once released");
    }

    let page = check_plain_page(
        &daemon,
        promtool.as_ref(),
        "after requests, a refusal, a reset and a cold build",
    );
    for sample in [
        "tt_serving_requests_total{model=\"m\",outcome=\"ok\"} 3",
        "tt_serving_requests_total{model=\"\",outcome=\"unknown_model\"} 1",
        "tt_serving_cache_builds_total{model=\"m\",outcome=\"ok\"} 1",
        "tt_serving_slot_starts_total{slot=\"m\",model=\"m\",mode=\"cold\"} 1",
    ] {
        assert!(
            page.lines().any(|l| l == sample),
            "no `{sample}` in:\n{page}"
        );
    }
    let reset_line = format!(
        "tt_serving_card_resets_total{{card=\"{}\",outcome=\"proven\"}} 1",
        FakeHw::bdf(1)
    );
    assert!(page.lines().any(|l| l == reset_line), "{page}");
    let (typed, _) = metadata(&page);
    assert_eq!(typed, documented(), "after the events");

    // Prometheus asks for OpenMetrics and gets it: the same families, a
    // counter's named without `_total`, and the page ends in `# EOF`.
    let (openmetrics, content_type) =
        body_and_type(&http_get_with(&daemon, "/metrics", Some(PROMETHEUS_ACCEPT)));
    assert_eq!(
        content_type,
        "application/openmetrics-text; version=1.0.0; charset=utf-8"
    );
    assert!(openmetrics.trim_end().ends_with("# EOF"), "{openmetrics}");
    let (om_typed, om_helped) = metadata(&openmetrics);
    let as_plain: BTreeSet<(String, String)> = om_typed
        .iter()
        .map(|(name, kind)| match kind.as_str() {
            "counter" => (format!("{name}_total"), kind.clone()),
            _ => (name.clone(), kind.clone()),
        })
        .collect();
    assert_eq!(as_plain, typed, "{openmetrics}");
    assert!(
        om_typed.iter().all(|(n, _)| om_helped.contains(n)),
        "{openmetrics}"
    );
}
