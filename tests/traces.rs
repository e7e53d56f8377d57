//! OpenTelemetry traces end to end (#45): the daemon and its worker export
//! spans over OTLP/gRPC to a real receiver (the OpenTelemetry protocol's
//! own Python package behind grpcio, `clients/otlp_receiver.py`). A
//! streamed request that carries a client's W3C `traceparent` shows up as
//! one trace: the daemon's request span a child of the client's, its queue
//! and worker-call spans children of that, and the worker's own span (in
//! the worker process, service `tt-worker`) a child of the daemon's call,
//! with the first- and last-token events and the counts the client got.
//! A slot's start and a card reset are spans too. Real daemon, worker and
//! ttctl on fake cards.

use serde_json::Value;
use std::process::Command;
use tt_serving_tests::{
    model_table, output_text, tiny_model, Daemon, DaemonOptions, FakeHw, OtlpReceiver,
};

/// A streamed chat completion over the OpenAI door, with extra headers;
/// returns the usage of its last chunk.
fn stream_chat(address: &str, headers: &[String]) -> Value {
    let mut cmd = Command::new("curl");
    cmd.args(["-sS", "-N", "--http1.1", "--max-time", "60"]);
    for h in headers {
        cmd.args(["-H", h]);
    }
    let out = cmd
        .args(["-H", "content-type: application/json", "-d"])
        .arg(r#"{"model":"m","messages":[{"role":"user","content":"hello"}],"max_tokens":6,"temperature":0,"stream":true,"stream_options":{"include_usage":true}}"#)
        .arg(format!("http://{address}/v1/chat/completions"))
        .output()
        .expect("run curl");
    assert!(out.status.success(), "{}", output_text(&out));
    let body = String::from_utf8_lossy(&out.stdout).to_string();
    body.lines()
        .rev()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .filter_map(|chunk| chunk.get("usage").filter(|u| !u.is_null()).cloned())
        .next()
        .unwrap_or_else(|| panic!("no usage in the stream: {body}"))
}

#[test]
fn a_streamed_request_is_one_trace_from_the_client_through_the_worker() {
    let Some(python) = OtlpReceiver::python() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let receiver = OtlpReceiver::start(&python, tmp.path());
    let hw = FakeHw::new(2);
    let model = tiny_model(tmp.path());
    let daemon = Daemon::start(
        &hw,
        DaemonOptions {
            extra: format!(
                "[openai]\nlisten = \"127.0.0.1:0\"\n\n[tracing]\notlp_endpoint = \"http://127.0.0.1:{}\"\n\n{}",
                receiver.port,
                model_table("m", 1, &[0], &model, "")
            ),
            ..Default::default()
        },
    );
    daemon.wait_slot_state("m", "ready");
    let address = daemon.status()["daemon"]["openai_address"]
        .as_str()
        .unwrap_or_default()
        .to_string();

    // The client's trace: its id and the span the request is sent from.
    let trace_id = "4bf92f3577b34da6a3ce929d0e0e4736";
    let client_span = "00f067aa0ba902b7";
    let usage = stream_chat(
        &address,
        &[format!("traceparent: 00-{trace_id}-{client_span}-01")],
    );
    let in_trace = |name: &'static str, service: &'static str| {
        move |s: &Value| s["trace_id"] == trace_id && s["name"] == name && s["service"] == service
    };

    // The door's span: a child of the client's, server kind (2), with the
    // request's model, door, slot and the counts the client got.
    let request = receiver.wait_for(
        "the daemon's request span",
        in_trace("POST /v1/chat/completions", "tt-servingd"),
    );
    assert_eq!(request["parent_span_id"], client_span, "{request}");
    assert_eq!(request["kind"], 2, "{request}");
    let a = &request["attributes"];
    assert_eq!(a["gen_ai.request.model"], "m", "{request}");
    assert_eq!(a["tt.door"], "openai", "{request}");
    assert_eq!(a["tt.key"], "anonymous", "{request}");
    assert_eq!(a["tt.slot"], "m", "{request}");
    assert_eq!(a["tt.outcome"], "ok", "{request}");
    assert_eq!(
        a["gen_ai.usage.input_tokens"], usage["prompt_tokens"],
        "{request}"
    );
    assert_eq!(
        a["gen_ai.usage.output_tokens"], usage["completion_tokens"],
        "{request}"
    );
    assert_eq!(
        a["gen_ai.response.finish_reasons"],
        serde_json::json!(["length"]),
        "{request}"
    );

    // The queue wait and the routing decision.
    let queue = receiver.wait_for("the queue span", in_trace("queue", "tt-servingd"));
    assert_eq!(queue["parent_span_id"], request["span_id"], "{queue}");
    assert_eq!(queue["attributes"]["tt.slot"], "m", "{queue}");

    // The daemon's call to the worker (client kind, 3) ...
    let call = receiver.wait_for(
        "the daemon's call to the worker",
        in_trace("worker generate", "tt-servingd"),
    );
    assert_eq!(call["parent_span_id"], request["span_id"], "{call}");
    assert_eq!(call["kind"], 3, "{call}");
    assert_eq!(
        OtlpReceiver::event_names(&call),
        ["first_token", "last_token"],
        "{call}"
    );

    // ... and the worker's own span, exported by the worker process: a
    // child of the daemon's call, named by its slot.
    let worker = receiver.wait_for(
        "the worker's span",
        in_trace("worker generate", "tt-worker"),
    );
    assert_eq!(worker["parent_span_id"], call["span_id"], "{worker}");
    assert_eq!(worker["kind"], 2, "{worker}");
    assert_eq!(worker["resource"]["tt.slot"], "m", "{worker}");
    assert_eq!(
        OtlpReceiver::event_names(&worker),
        ["first_token", "last_token"],
        "{worker}"
    );
    let w = &worker["attributes"];
    assert_eq!(
        w["gen_ai.usage.input_tokens"], usage["prompt_tokens"],
        "{worker}"
    );
    assert_eq!(
        w["gen_ai.usage.output_tokens"], usage["completion_tokens"],
        "{worker}"
    );
    assert_eq!(
        w["gen_ai.response.id"], call["attributes"]["gen_ai.response.id"],
        "{worker}"
    );

    // Without a traceparent the request starts a trace of its own.
    stream_chat(&address, &[]);
    let root = receiver.wait_for("a request span without a client trace", |s| {
        s["name"] == "POST /v1/chat/completions" && s["trace_id"] != trace_id
    });
    assert_eq!(root["parent_span_id"], "", "{root}");

    // The slot's start: a span that ended at Ready.
    let start = receiver.wait_for("the slot's start span", |s| {
        s["name"] == "slot start" && s["attributes"]["tt.slot"] == "m"
    });
    assert!(
        OtlpReceiver::event_names(&start).contains(&"ready".to_string()),
        "{start}"
    );

    // A card reset (the free card) is a span with its cards.
    let reset = daemon.ttctl(&["card", "reset", "1"]);
    assert!(reset.status.success(), "{}", output_text(&reset));
    let span = receiver.wait_for("the card reset span", |s| s["name"] == "card reset");
    assert_eq!(span["attributes"]["tt.cards"], FakeHw::bdf(1), "{span}");
    assert_eq!(span["attributes"]["tt.reset.manual"], true, "{span}");
    assert_eq!(
        span["status"]["code"], 0,
        "an unset status is a success: {span}"
    );
}
