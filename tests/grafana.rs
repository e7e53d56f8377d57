//! The Grafana dashboard in `examples/grafana/tt-serving.json` against what
//! a real daemon exports. Every `tt_serving_*` name a panel or a template
//! variable queries must be a sample name the scrape's `# TYPE` lines allow
//! (a counter's `_total`, a histogram's `_bucket`, `_sum` and `_count`, a
//! gauge as it is), and every label a query selects on, groups by or puts
//! in a legend must be on that metric's samples. The daemon runs real
//! `tt-worker` replicas on fake cards and is driven until every charted
//! metric has samples: requests through two Ready replicas (latency
//! histograms, tokens, prefix cache, affinity, KV), a killed worker (a
//! restart and a proven card reset) and a spare card whose heartbeat is
//! frozen (a failed reset and a proof failure).

use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;
use tt_fakehw::Fault;
use tt_serving_tests::chaos_support as chaos;
use tt_serving_tests::{
    bin, generate, output_text, tiny_model, wait_until, Daemon, DaemonOptions, FakeHw, DEADLINE,
};

const DASHBOARD: &str = include_str!("../examples/grafana/tt-serving.json");

/// The datasource every panel, target and query variable must name.
const DATASOURCE_UID: &str = "${datasource}";

/// Labels the dashboard must use somewhere, so that the label check below
/// is known to cover them.
const LABELS_USED: [&str; 8] = [
    "model", "slot", "card", "state", "outcome", "cause", "mode", "le",
];

fn dashboard() -> Value {
    serde_json::from_str(DASHBOARD).expect("examples/grafana/tt-serving.json is JSON")
}

/// What one scrape of `/metrics` says the daemon exports.
#[derive(Debug, Default)]
struct Exported {
    /// Every sample name the `# TYPE` lines allow, with its family.
    names: BTreeMap<String, String>,
    /// Each family's type.
    families: BTreeMap<String, String>,
    /// The label names on each sample name's samples (absent: no samples).
    labels: BTreeMap<String, BTreeSet<String>>,
}

impl Exported {
    fn parse(text: &str) -> Exported {
        let mut out = Exported::default();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (family, kind) = rest.split_once(' ').expect("# TYPE name type");
                let suffixes: &[&str] = match kind.trim() {
                    "counter" => &["_total"],
                    "histogram" => &["_bucket", "_sum", "_count"],
                    _ => &[""],
                };
                for suffix in suffixes {
                    out.names
                        .insert(format!("{family}{suffix}"), family.to_string());
                }
                out.families
                    .insert(family.to_string(), kind.trim().to_string());
            } else if !line.starts_with('#') && !line.trim().is_empty() {
                let (name, labels) =
                    sample_labels(line).unwrap_or_else(|| panic!("unparsable sample `{line}`"));
                out.labels.entry(name).or_default().extend(labels);
            }
        }
        out
    }
}

/// The name and label names of one exposition sample line.
fn sample_labels(line: &str) -> Option<(String, BTreeSet<String>)> {
    let end = line.find(['{', ' '])?;
    let mut labels = BTreeSet::new();
    if let Some(mut rest) = line[end..].strip_prefix('{') {
        loop {
            rest = rest.trim_start_matches(',');
            if rest.starts_with('}') {
                break;
            }
            let (key, value) = rest.split_once("=\"")?;
            labels.insert(key.trim().to_string());
            rest = &value[closing_quote(value)? + 1..];
        }
    }
    Some((line[..end].to_string(), labels))
}

/// The index of the `"` that ends a quoted string whose text starts `text`.
fn closing_quote(text: &str) -> Option<usize> {
    let mut escaped = false;
    for (i, c) in text.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' => escaped = true,
            '"' => return Some(i),
            _ => {}
        }
    }
    None
}

/// What one PromQL query (or `label_values(...)` variable query) uses.
#[derive(Debug, Default)]
struct Query {
    /// Each `tt_serving_*` name with the labels its `{...}` selector matches on.
    metrics: Vec<(String, BTreeSet<String>)>,
    /// The label lists of `by`, `without`, `on`, `ignoring` (and the label
    /// argument of `label_values`).
    grouping: Vec<BTreeSet<String>>,
    /// `$name` and `${name}` references.
    variables: BTreeSet<String>,
}

fn ident_char(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_' || c == b':'
}

/// A small PromQL reader: enough for the names, selectors and grouping
/// clauses a dashboard uses, skipping string literals.
fn analyse(expr: &str) -> Query {
    let b = expr.as_bytes();
    let mut q = Query::default();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c == b'"' || c == b'\'' {
            i += skip_string(&expr[i..]);
        } else if (c.is_ascii_alphabetic() || c == b'_')
            && (i == 0 || !(ident_char(b[i - 1]) || b[i - 1] == b'$' || b[i - 1] == b'{'))
        {
            let mut end = i;
            while end < b.len() && ident_char(b[end]) {
                end += 1;
            }
            let word = &expr[i..end];
            let mut next = end;
            while next < b.len() && b[next].is_ascii_whitespace() {
                next += 1;
            }
            i = end;
            if word.starts_with("tt_serving_") {
                let mut selected = BTreeSet::new();
                if b.get(next) == Some(&b'{') {
                    let close = next + selector_end(&expr[next..]);
                    selected = matcher_labels(&expr[next + 1..close]);
                    i = close + 1;
                }
                q.metrics.push((word.to_string(), selected));
            } else if ["by", "without", "on", "ignoring"].contains(&word)
                && b.get(next) == Some(&b'(')
            {
                let close = next + expr[next..].find(')').expect("a closing parenthesis");
                q.grouping.push(label_list(&expr[next + 1..close]));
                i = close + 1;
            }
        } else {
            i += 1;
        }
    }
    // Variables, inside strings too (`model=~"$model"`).
    for (at, _) in expr.match_indices('$') {
        let name = expr[at + 1..].trim_start_matches('{');
        let end = name
            .bytes()
            .position(|c| !ident_char(c))
            .unwrap_or(name.len());
        q.variables.insert(name[..end].to_string());
    }
    if let Some(args) = expr
        .trim()
        .strip_prefix("label_values(")
        .and_then(|a| a.strip_suffix(')'))
    {
        let label = args.rsplit_once(',').map_or(args, |(_, l)| l);
        q.grouping.push(label_list(label));
    }
    q
}

/// Bytes of the string literal at the start of `text`, quotes included.
fn skip_string(text: &str) -> usize {
    let quote = text.as_bytes()[0] as char;
    let mut escaped = false;
    for (i, c) in text.char_indices().skip(1) {
        match c {
            _ if escaped => escaped = false,
            '\\' => escaped = true,
            _ if c == quote => return i + 1,
            _ => {}
        }
    }
    text.len()
}

/// The index of the `}` closing the selector that starts `text`.
fn selector_end(text: &str) -> usize {
    let mut i = 1;
    while i < text.len() {
        match text.as_bytes()[i] {
            b'"' | b'\'' => i += skip_string(&text[i..]),
            b'}' => return i,
            _ => i += 1,
        }
    }
    panic!("unclosed selector in `{text}`")
}

/// The label names of the matchers inside `{...}`.
fn matcher_labels(inside: &str) -> BTreeSet<String> {
    let mut labels = BTreeSet::new();
    let mut rest = inside;
    loop {
        rest = rest.trim_start_matches(|c: char| c == ',' || c.is_whitespace());
        if rest.is_empty() {
            return labels;
        }
        let end = rest
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(rest.len());
        labels.insert(rest[..end].to_string());
        let quote = rest.find(['"', '\'']).expect("a quoted matcher value");
        rest = &rest[quote + skip_string(&rest[quote..])..];
    }
}

fn label_list(text: &str) -> BTreeSet<String> {
    text.split(',')
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect()
}

/// The `{{label}}` references of a legend.
fn legend_labels(legend: &str) -> BTreeSet<String> {
    legend
        .split("{{")
        .skip(1)
        .filter_map(|part| part.split_once("}}"))
        .map(|(label, _)| label.trim().to_string())
        .collect()
}

/// Every panel, rows included, and the panels inside collapsed rows.
fn all_panels(dashboard: &Value) -> Vec<&Value> {
    let mut out = Vec::new();
    for panel in dashboard["panels"].as_array().into_iter().flatten() {
        out.push(panel);
        out.extend(panel["panels"].as_array().into_iter().flatten());
    }
    out
}

fn names_the_variable(datasource: &Value) -> bool {
    datasource["uid"] == DATASOURCE_UID && datasource["type"] == "prometheus"
}

/// Problems with the dashboard's shape: the template variables, and a
/// datasource on every panel, target and query variable that is the
/// `datasource` variable.
fn structure_problems(dashboard: &Value) -> Vec<String> {
    let mut problems = Vec::new();
    let variables = dashboard["templating"]["list"].as_array();
    let variable = |name: &str| variables.into_iter().flatten().find(|v| v["name"] == name);
    match variable("datasource") {
        Some(v) if v["type"] == "datasource" && v["query"] == "prometheus" => {}
        other => problems.push(format!(
            "templating.list needs a `datasource` variable of type datasource over prometheus, has {other:?}"
        )),
    }
    for name in ["model", "slot", "card"] {
        match variable(name) {
            Some(v) if v["type"] == "query" && names_the_variable(&v["datasource"]) => {}
            other => problems.push(format!(
                "templating.list needs a `{name}` query variable on {DATASOURCE_UID}, has {other:?}"
            )),
        }
    }
    let mut ids = BTreeSet::new();
    for panel in all_panels(dashboard) {
        let title = panel["title"].as_str().unwrap_or("(untitled)");
        if !ids.insert(panel["id"].to_string()) {
            problems.push(format!("panel {title:?}: id {} is not unique", panel["id"]));
        }
        if panel["type"] == "row" {
            continue;
        }
        if !names_the_variable(&panel["datasource"]) {
            problems.push(format!(
                "panel {title:?}: datasource {} is not the {DATASOURCE_UID} variable",
                panel["datasource"]
            ));
        }
        let targets = panel["targets"].as_array().into_iter().flatten();
        if targets.clone().next().is_none() {
            problems.push(format!("panel {title:?}: no targets"));
        }
        for target in targets {
            if !names_the_variable(&target["datasource"]) {
                problems.push(format!(
                    "panel {title:?}, target {}: datasource {} is not the {DATASOURCE_UID} variable",
                    target["refId"], target["datasource"]
                ));
            }
            if target["expr"].as_str().is_none_or(|e| e.trim().is_empty()) {
                problems.push(format!(
                    "panel {title:?}, target {}: no expr",
                    target["refId"]
                ));
            }
        }
    }
    problems
}

/// One query of the dashboard: where it is, its PromQL and its legend.
struct Located {
    place: String,
    expr: String,
    legend: String,
}

fn queries(dashboard: &Value) -> Vec<Located> {
    let mut out = Vec::new();
    for panel in all_panels(dashboard) {
        let title = panel["title"].as_str().unwrap_or("(untitled)");
        for target in panel["targets"].as_array().into_iter().flatten() {
            out.push(Located {
                place: format!("panel {title:?}, target {}", target["refId"]),
                expr: target["expr"].as_str().unwrap_or("").to_string(),
                legend: target["legendFormat"].as_str().unwrap_or("").to_string(),
            });
        }
    }
    for variable in dashboard["templating"]["list"]
        .as_array()
        .into_iter()
        .flatten()
    {
        if variable["type"] != "query" {
            continue;
        }
        let query = &variable["query"];
        let expr = query["query"].as_str().or(query.as_str()).unwrap_or("");
        out.push(Located {
            place: format!("variable {}", variable["name"]),
            expr: expr.to_string(),
            legend: String::new(),
        });
    }
    out
}

/// Every way the dashboard's queries disagree with `exported`, plus the
/// shape problems; empty when the dashboard is true to the daemon.
fn problems(dashboard: &Value, exported: &Exported) -> Vec<String> {
    let mut problems = structure_problems(dashboard);
    let defined: BTreeSet<String> = dashboard["templating"]["list"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| v["name"].as_str().map(str::to_string))
        .collect();
    let mut charted = BTreeSet::new();
    let mut labels_used = BTreeSet::new();
    for Located {
        place,
        expr,
        legend,
    } in queries(dashboard)
    {
        let q = analyse(&expr);
        if q.metrics.is_empty() {
            problems.push(format!("{place}: `{expr}` queries no tt_serving_ metric"));
        }
        for variable in &q.variables {
            if !variable.starts_with("__") && !defined.contains(variable) {
                problems.push(format!("{place}: ${variable} is not a template variable"));
            }
        }
        let legend = legend_labels(&legend);
        for group in &q.grouping {
            if let Some(l) = legend.difference(group).next() {
                problems.push(format!(
                    "{place}: legend label {l} is not kept by the grouping {group:?} of `{expr}`"
                ));
            }
        }
        for (name, selected) in &q.metrics {
            let Some(family) = exported.names.get(name) else {
                problems.push(format!(
                    "{place}: {name} is not exported by the daemon (no # TYPE line allows it)"
                ));
                continue;
            };
            charted.insert(family.clone());
            let Some(has) = exported.labels.get(name) else {
                problems.push(format!(
                    "{place}: {name} has no samples in the scrape, so its labels cannot be \
                     checked; the test's scenario must produce one"
                ));
                continue;
            };
            let wanted = selected
                .iter()
                .chain(q.grouping.iter().flatten())
                .chain(&legend);
            for label in wanted {
                labels_used.insert(label.clone());
                if !has.contains(label) {
                    problems.push(format!(
                        "{place}: {name} has no label `{label}` (it has {has:?}): `{expr}`"
                    ));
                }
            }
        }
    }
    // Families with samples in the scenario's scrape: the page describes
    // every family (#57), also those the scenario never produces, which
    // stay uncharted for now (host-sampling requests, the by-priority
    // queue, refused OpenAI connections).
    let with_samples: BTreeSet<&String> = exported
        .names
        .iter()
        .filter(|(name, _)| exported.labels.contains_key(*name))
        .map(|(_, family)| family)
        .collect();
    for family in exported.families.keys() {
        if with_samples.contains(family) && !charted.contains(family) {
            problems.push(format!(
                "{family} ({}) is exported but on no panel of the dashboard; chart it",
                exported.families[family]
            ));
        }
    }
    for label in LABELS_USED {
        if !labels_used.contains(label) {
            problems.push(format!("no query uses the label `{label}`"));
        }
    }
    problems
}

#[test]
fn the_dashboard_has_its_variables_and_every_panel_uses_the_datasource_variable() {
    let dashboard = dashboard();
    let problems = structure_problems(&dashboard);
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    // The reader finds names, selectors, groupings and variables, and is
    // not fooled by a string that looks like them.
    let q = analyse(
        "histogram_quantile(0.9, sum by (le, model) (rate(tt_serving_x_bucket{model=~\"$model\", \
         slot!=\"by (card)\"}[$__rate_interval]))) / on (model) tt_serving_y",
    );
    let names: Vec<&str> = q.metrics.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["tt_serving_x_bucket", "tt_serving_y"]);
    assert_eq!(
        q.metrics[0].1,
        BTreeSet::from(["model".to_string(), "slot".to_string()])
    );
    assert_eq!(
        q.grouping,
        [
            BTreeSet::from(["le".to_string(), "model".to_string()]),
            BTreeSet::from(["model".to_string()])
        ]
    );
    assert_eq!(
        q.variables,
        BTreeSet::from(["model".to_string(), "__rate_interval".to_string()])
    );
    let q = analyse("label_values(tt_serving_slot_state{model=~\"$model\"}, slot)");
    assert_eq!(q.grouping, [BTreeSet::from(["slot".to_string()])]);
}

#[test]
fn every_metric_and_label_on_the_dashboard_is_one_the_daemon_exports() {
    let hw = FakeHw::new(3);
    // A host with a 1 GiB hugepage pool (the fake root plays none).
    let pages = hw
        .root
        .sys_root()
        .join("kernel/mm/hugepages/hugepages-1048576kB");
    std::fs::create_dir_all(&pages).unwrap();
    std::fs::write(pages.join("nr_hugepages"), "16\n").unwrap();
    std::fs::write(pages.join("free_hugepages"), "16\n").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path());
    let daemon = Daemon::start(
        &hw,
        DaemonOptions {
            extra: format!(
                "\n[models.m]\ntp = 1\nreplicas = [[\"{}\"], [\"{}\"]]\ncheckpoint = \"{}\"\n\
                 worker = [\"{}\"]\ndrain_timeout_secs = 5\n[models.m.restart]\nbackoff_ms = 50\n",
                FakeHw::bdf(0),
                FakeHw::bdf(1),
                model.display(),
                bin("tt-worker").display()
            ),
            ..Default::default()
        },
    );
    daemon.wait_slot_state("m/0", "ready");
    daemon.wait_slot_state("m/1", "ready");

    // Requests among two Ready replicas: latencies, tokens, the prefix
    // cache and affinity routing, and an unknown model.
    let address = daemon.inference_address();
    let rt = tokio::runtime::Runtime::new().expect("tokio runtime");
    for prompt in ["hello world", "hello world again", "something else"] {
        rt.block_on(generate(&address, "m", prompt, 6))
            .expect("answered");
    }
    rt.block_on(generate(&address, "nope", "hello", 4))
        .expect_err("unknown model");

    // A worker killed from outside: a restart, and a reset of its card.
    let first = daemon.slot("m/0");
    let pid = first["worker_pid"].as_u64().expect("a worker pid") as i32;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("kill the worker");
    wait_until("m/0 to come back", || {
        let slot = daemon.slot("m/0");
        (slot["state"] == "ready" && slot["worker_pid"] != first["worker_pid"]).then_some(())
    });

    // The spare card's heartbeat is frozen: its reset's proof fails.
    let spare = FakeHw::bdf(2);
    hw.root
        .set_fault(&spare, Fault::FrozenHeartbeat)
        .expect("set the fault");
    let reset = daemon.ttctl(&["card", "reset", "2"]);
    assert_eq!(reset.status.code(), Some(1), "{}", output_text(&reset));
    daemon.wait_card_state(&spare, "quarantined");

    // Every charted name has samples once the KV gauges of the restarted
    // replica are back (they come with the watchdog's Engine.Health).
    let dashboard = dashboard();
    let charted: BTreeSet<String> = queries(&dashboard)
        .iter()
        .flat_map(|q| analyse(&q.expr).metrics)
        .map(|(name, _)| name)
        .collect();
    let started = Instant::now();
    let (exported, text) = loop {
        // As Prometheus scrapes it (OpenMetrics), since Grafana charts
        // what Prometheus stored.
        let text = chaos::scrape_with(&daemon, Some(chaos::PROMETHEUS_ACCEPT)).text;
        let exported = Exported::parse(&text);
        let missing: Vec<&String> = charted
            .iter()
            .filter(|n| exported.names.contains_key(*n) && !exported.labels.contains_key(*n))
            .collect();
        if missing.is_empty() || started.elapsed() > DEADLINE {
            break (exported, text);
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    assert!(
        exported.families.len() > 20,
        "a scrape with its # TYPE lines:\n{text}"
    );
    let found = problems(&dashboard, &exported);
    assert!(
        found.is_empty(),
        "the dashboard disagrees with the daemon:\n{}\n\nscrape:\n{text}",
        found.join("\n")
    );

    // The check fails on a panel the daemon could not fill: a metric it
    // does not export, a label a metric lacks (in a grouping, a selector,
    // a legend), a histogram read without its suffix, an undefined
    // variable and a datasource that is not the variable.
    let mut broken = dashboard.clone();
    let target = |r: &str, expr: &str, legend: &str| {
        json!({
            "refId": r,
            "datasource": {"type": "prometheus", "uid": DATASOURCE_UID},
            "expr": expr,
            "legendFormat": legend,
        })
    };
    broken["panels"].as_array_mut().unwrap().push(json!({
        "type": "timeseries",
        "title": "broken",
        "id": 9999,
        "datasource": {"type": "prometheus", "uid": "prometheus-1"},
        "targets": [
            target("A", "sum by (cause) (rate(tt_serving_requests_total[5m]))", ""),
            target("B", "rate(tt_serving_no_such_thing_total[$__rate_interval])", ""),
            target("C", "tt_serving_slot_state{card=\"x\"}", ""),
            target("D", "sum by (model) (tt_serving_num_requests_waiting)", "{{slot}}"),
            target("E", "rate(tt_serving_time_to_first_token_seconds[5m])", ""),
            target("F", "tt_serving_card_power_watts{card=~\"$cards\"}", ""),
        ],
    }));
    let found = problems(&broken, &exported).join("\n");
    for expected in [
        "tt_serving_requests_total has no label `cause`",
        "tt_serving_no_such_thing_total is not exported",
        "tt_serving_slot_state has no label `card`",
        "legend label slot is not kept",
        "tt_serving_num_requests_waiting has no label `slot`",
        "tt_serving_time_to_first_token_seconds is not exported",
        "$cards is not a template variable",
        "datasource {\"type\":\"prometheus\",\"uid\":\"prometheus-1\"} is not the",
    ] {
        assert!(found.contains(expected), "no `{expected}` in:\n{found}");
    }
}
