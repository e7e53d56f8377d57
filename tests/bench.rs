//! `ttctl bench` against a real daemon serving `tt-worker` on a fake card:
//! the rungs it measures, calibrated prompts, records with the identity of
//! what ran, validity, and `ttctl bench cite` on a document citing them.

use serde_json::Value;
use std::path::Path;
use tt_serving_tests::{model_table, output_text, tiny_model, Daemon, DaemonOptions, FakeHw};

fn records(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .expect("records file")
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON record"))
        .collect()
}

fn daemon(hw: &FakeHw, dir: &Path, flags: &str) -> Daemon {
    let model = tiny_model(dir);
    let d = Daemon::start(
        hw,
        DaemonOptions {
            extra: model_table("m", 1, &[0], &model, flags),
            ..Default::default()
        },
    );
    d.wait_slot_state("m", "ready");
    d
}

#[test]
fn rungs_are_measured_calibrated_and_recorded_with_what_ran() {
    let hw = FakeHw::new(1);
    let dir = tempfile::tempdir().expect("temp dir");
    let d = daemon(&hw, dir.path(), "flags = { TTW_KV_F16 = \"1\" }\n");
    let out = dir.path().join("records.jsonl");
    let run = d.ttctl(&[
        "bench",
        "m",
        "--batch",
        "1,3",
        // Long enough that the few tokens by which the tiny vocabulary's
        // nonces differ stay within 5% (at 120, a run whose clock picked
        // short nonces saw 113 tokens: invalid), short enough for the tiny
        // model's 256-token context with the output.
        "--prompt-tokens",
        "200",
        "--output-tokens",
        "24",
        "--repeats",
        "2",
        "--warmup",
        "1",
        "--out",
        out.to_str().unwrap(),
    ]);
    let stdout = output_text(&run);
    assert!(
        run.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(
        stderr.contains("b=3 p=200: warm-up 1/1"),
        "progress: {stderr}"
    );
    assert!(
        stderr.contains("b=3 p=200: round 2/2"),
        "progress: {stderr}"
    );
    assert!(stdout.contains("TTFT p50"), "{stdout}");

    let recs = records(&out);
    assert_eq!(recs.len(), 2, "one record per rung");
    for (rec, batch) in recs.iter().zip([1, 3]) {
        assert_eq!(rec["kind"], "bench");
        assert_eq!(rec["workload"]["batch"], batch);
        assert_eq!(rec["valid"], true, "{rec}");
        // Calibrated against the server's count, within 5%.
        let cal = &rec["calibration"];
        assert_eq!(cal["within_tolerance"], true, "{cal}");
        let seen = rec["prompt_tokens_seen"].as_array().unwrap();
        for n in seen {
            let n = n.as_f64().unwrap();
            assert!((n - 200.0).abs() <= 10.0, "prompt of {n} tokens for 200");
        }
        assert!(rec["ttft_ms"]["p50"].as_f64().unwrap() > 0.0);
        assert!(rec["ttft_ms"]["p99"].as_f64().unwrap() >= rec["ttft_ms"]["p50"].as_f64().unwrap());
        assert!(rec["aggregate_tok_s"]["median"].as_f64().unwrap() > 0.0);
        assert!(
            rec["decode_tok_s_per_user"]["median"].as_f64().unwrap() > 0.0,
            "{rec}"
        );
        assert_eq!(
            rec["aggregate_tok_s"]["rounds"].as_array().unwrap().len(),
            2
        );
        assert_eq!(rec["errors"], 0);
        // Prompts are unique from their first block: a prefix cache that
        // matches inside a block (tt-worker copies one) may take a nonce
        // word or two from an earlier request, never a block's worth.
        let requests = batch * 2;
        let cached = rec["cached_prompt_tokens"].as_u64().unwrap();
        assert!(
            cached < 16 * requests,
            "{cached} cached prompt tokens: {rec}"
        );
        // What ran: the slot, its engine, flags, variant and banners.
        let slot = &rec["identity"]["slots"][0];
        assert_eq!(slot["slot"], "m");
        assert!(
            slot["engine"].as_str().unwrap().starts_with("tt-worker"),
            "{slot}"
        );
        assert_eq!(slot["flags"]["TTW_KV_F16"], "1");
        assert!(!slot["cache_variant"].as_str().unwrap().is_empty());
        assert_eq!(rec["identity"]["cards"][0]["bdf"], FakeHw::bdf(0));
        // Made on a fake root: said so, and no card type, firmware or
        // driver is claimed.
        let identity = &rec["identity"];
        assert!(
            identity["hardware"]
                .as_str()
                .unwrap()
                .starts_with("simulated: sys_root "),
            "{identity}"
        );
        assert!(identity["driver"].is_null(), "{identity}");
        assert!(identity["cards"][0]["card_type"].is_null(), "{identity}");
        assert!(identity["cards"][0]["firmware"].is_null(), "{identity}");
        // What moves the numbers: the engine's context, the batch limit
        // and the worker's command line.
        assert!(slot["context_length"].as_u64().unwrap() > 0, "{slot}");
        assert!(slot["max_in_flight"].as_u64().unwrap() > 0, "{slot}");
        assert!(
            slot["worker_command"][0]
                .as_str()
                .unwrap()
                .ends_with("tt-worker"),
            "{slot}"
        );
        // The checkpoint's and the worker binary's identity, from the
        // variant's inputs.
        let variant = slot["cache_variant"].as_str().unwrap();
        let inputs = &rec["identity"]["variants"][variant];
        assert!(
            inputs["checkpoint"].as_str().unwrap().contains("tiny.gguf"),
            "{inputs}"
        );
        assert!(
            inputs["worker"].as_str().unwrap().contains("tt-worker"),
            "{inputs}"
        );
        let banners: Vec<&str> = rec["banners"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(Value::as_str)
            .collect();
        assert!(banners.contains(&"TTW_KV_F16"), "{banners:?}");
    }
    assert_ne!(recs[0]["id"], recs[1]["id"]);

    // A document citing them passes; a wrong or uncited number fails.
    let id = recs[1]["id"].as_str().unwrap();
    let tok_s = recs[1]["aggregate_tok_s"]["median"].as_f64().unwrap();
    let doc = dir.path().join("doc.md");
    let good = format!(
        "# Results\n\n<!-- measured -->\n| rung | tok/s |\n|---|---|\n| B=3 | {tok_s:.1} {{r:{id}.aggregate_tok_s.median}} |\n"
    );
    std::fs::write(&doc, &good).unwrap();
    let ok = d.ttctl(&[
        "bench",
        "cite",
        doc.to_str().unwrap(),
        out.to_str().unwrap(),
    ]);
    assert!(ok.status.success(), "{}", output_text(&ok));
    let wrong = good.replace(
        &format!("{tok_s:.1} "),
        &format!("{:.1} ", tok_s * 2.0 + 1.0),
    );
    std::fs::write(&doc, wrong).unwrap();
    let bad = d.ttctl(&[
        "bench",
        "cite",
        doc.to_str().unwrap(),
        out.to_str().unwrap(),
    ]);
    assert_eq!(bad.status.code(), Some(1));
    assert!(
        output_text(&bad).contains("doc.md:6: "),
        "{}",
        output_text(&bad)
    );
    assert!(
        output_text(&bad).contains("does not match"),
        "{}",
        output_text(&bad)
    );
    std::fs::write(
        &doc,
        "<!-- measured -->\n| a | b |\n|---|---|\n| B=3 | 12.5 |\n",
    )
    .unwrap();
    let uncited = d.ttctl(&[
        "bench",
        "cite",
        doc.to_str().unwrap(),
        out.to_str().unwrap(),
    ]);
    assert_eq!(uncited.status.code(), Some(1));
    assert!(output_text(&uncited).contains("1 number(s) and 0 citation(s)"));
}

#[test]
fn a_rung_whose_prompts_miss_their_length_is_recorded_invalid() {
    let hw = FakeHw::new(1);
    let dir = tempfile::tempdir().expect("temp dir");
    let d = daemon(&hw, dir.path(), "");
    let out = dir.path().join("r.jsonl");
    // The nonce that makes prompts unique is alone longer than 4 tokens.
    let run = d.ttctl(&[
        "bench",
        "m",
        "--prompt-tokens",
        "4",
        "--output-tokens",
        "8",
        "--repeats",
        "1",
        "--warmup",
        "0",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(run.status.success(), "{}", output_text(&run));
    let rec = &records(&out)[0];
    assert_eq!(rec["valid"], false, "{rec}");
    assert_eq!(rec["calibration"]["within_tolerance"], false);
    assert!(
        rec["invalid_reasons"]
            .to_string()
            .contains("where 4 were wanted"),
        "{rec}"
    );
    assert!(
        output_text(&run).contains("NO: prompts of"),
        "{}",
        output_text(&run)
    );
}

#[test]
fn a_prompt_longer_than_the_context_is_refused_by_name() {
    let hw = FakeHw::new(1);
    let dir = tempfile::tempdir().expect("temp dir");
    let d = daemon(&hw, dir.path(), "");
    let out = dir.path().join("r.jsonl");
    // The tiny model's context is 256 tokens.
    let run = d.ttctl(&[
        "bench",
        "m",
        "--prompt-tokens",
        "4096",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert_eq!(run.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(
        stderr.contains("calibrating a 4096-token prompt"),
        "{stderr}"
    );
    assert!(stderr.contains("context"), "{stderr}");
}

#[test]
fn an_unknown_model_and_a_missing_model_are_usage_errors() {
    let hw = FakeHw::new(1);
    let dir = tempfile::tempdir().expect("temp dir");
    let d = daemon(&hw, dir.path(), "");
    let none = d.ttctl(&["bench"]);
    assert_eq!(none.status.code(), Some(2));
    let unknown = d.ttctl(&[
        "bench",
        "nope",
        "--out",
        dir.path().join("r").to_str().unwrap(),
    ]);
    assert_eq!(unknown.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&unknown.stderr).contains("nope"));
}

/// docs/PERFORMANCE.md: every table of numbers is either cited against the
/// records committed under bench/ or marked as figures from before them.
#[test]
fn the_performance_doc_cites_its_records() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    // The drivers whose records carry an `id`: ttctl ab, bench-chat, and
    // bench/engine's per-run summaries.
    let records = [
        "bench/ab/records.jsonl",
        "bench/chat/results.jsonl",
        "bench/engine/summaries.jsonl",
    ]
    .map(|f| root.join(f));
    let out = std::process::Command::new(tt_serving_tests::bin("ttctl"))
        .args(["bench", "cite"])
        .arg(root.join("docs/PERFORMANCE.md"))
        .args(&records)
        .output()
        .expect("run ttctl");
    assert!(out.status.success(), "{}", output_text(&out));
}

#[test]
fn the_accuracy_doc_cites_its_records() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let out = std::process::Command::new(tt_serving_tests::bin("ttctl"))
        .args(["bench", "cite"])
        .arg(root.join("docs/ACCURACY.md"))
        .arg(root.join("bench/eval/records.jsonl"))
        .output()
        .expect("run ttctl");
    assert!(out.status.success(), "{}", output_text(&out));
}
