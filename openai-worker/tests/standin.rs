//! The worker against the vLLM stand-in (tests/engines/vllm_standin.py):
//! real processes, engine.proto over the worker's unix socket, the engine's
//! own metrics and process table as the evidence.

mod common;

use common::*;
use std::os::unix::process::ExitStatusExt;
use std::time::{Duration, Instant};
use tt_serving_proto::v1 as pb;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn info_is_loading_with_moving_progress_then_ready_with_the_context_length() {
    let w = Worker::spawn(&Opts::vllm().env("STANDIN_LOAD_SECS", "3"));
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut loading = Vec::new();
    let ready = loop {
        assert!(Instant::now() < deadline, "not ready\n{}", w.output());
        if let Some(info) = w.info().await {
            let progress = info.progress.clone().unwrap_or_default();
            match pb::WorkerState::try_from(info.state) {
                Ok(pb::WorkerState::Loading) => loading.push(progress),
                Ok(pb::WorkerState::Ready) => break info,
                other => panic!("unexpected state {other:?}"),
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let mut done: Vec<u32> = loading.iter().map(|p| p.done).collect();
    done.dedup();
    assert!(
        done.len() >= 3,
        "load progress should move while loading, saw {done:?}"
    );
    assert!(
        loading
            .iter()
            .any(|p| p.message.contains("Loading weights: layer")),
        "{loading:?}"
    );
    assert_eq!(ready.context_length, 34816);
    assert_eq!(ready.model_name, "standin-model");
    assert!(ready.load_time_ms >= 2000, "{}", ready.load_time_ms);
    assert!(
        ready.engine_version.contains("(vllm 0.32.0+standin)"),
        "{}",
        ready.engine_version
    );
    assert_eq!(ready.cache_mode, "warm");
    assert_eq!(ready.ranks[0].bdf, "0000:01:00.0");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prompt_streams_text_with_token_ids_and_usage() {
    let w = Worker::start(&Opts::vllm()).await;
    let mut c = w.client().await;
    let out = run(&mut c, prompt_request("the quick brown fox", 5))
        .await
        .unwrap();
    assert_eq!(out.text, " w0 w1 w2 w3 w4");
    assert_eq!(out.ids.len(), 5, "one id per token: {out:?}");
    assert_eq!(out.deltas, 5);
    let f = &out.final_;
    assert_eq!(f.finish_reason, pb::FinishReason::Length as i32);
    let usage = f.usage.unwrap();
    assert_eq!((usage.prompt_tokens, usage.completion_tokens), (4, 5));
    let t = f.timings.unwrap();
    assert!(t.time_to_first_token_us > 0);
    assert!(t.decode_us > 0);
    assert!(
        w.stdout().contains("return_token_ids=True"),
        "{}",
        w.output()
    );

    // max_tokens 0 leaves the field out: vLLM's own default (16 for
    // completions) applies, and the stand-in's model stops after 12.
    let out = run(&mut c, prompt_request("the quick brown fox", 0))
        .await
        .unwrap();
    assert_eq!(out.final_.finish_reason, pb::FinishReason::Stop as i32);
    assert_eq!(out.ids.len(), 12);
    assert!(w.stdout().contains("max_tokens=16)"), "{}", w.output());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_that_needs_an_api_key_gets_it_and_serves() {
    // VLLM_API_KEY in the engine's environment (which it inherits from the
    // worker) makes vLLM refuse every /v1 call without the bearer token:
    // without sending it the worker would never be ready.
    let w = Worker::start(&Opts::vllm().env("VLLM_API_KEY", "s3cret-key")).await;
    let mut c = w.client().await;
    let out = run(&mut c, prompt_request("the quick brown fox", 3))
        .await
        .unwrap();
    assert_eq!(out.text, " w0 w1 w2");
    assert!(!w.output().contains("s3cret-key"), "the key was logged");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chat_is_templated_by_the_engine_and_streamed_with_ids() {
    let w = Worker::start(&Opts::vllm()).await;
    let mut c = w.client().await;
    let out = run(
        &mut c,
        chat_request(&[("system", "be brief"), ("user", "hello there")], 3),
    )
    .await
    .unwrap();
    assert_eq!(out.text, " w0 w1 w2");
    assert_eq!(out.ids.len(), 3);
    let usage = out.final_.usage.unwrap();
    // `<|system|>be brief\n<|user|>hello there\n<|assistant|>` in words.
    assert_eq!((usage.prompt_tokens, usage.completion_tokens), (5, 3));
    assert_eq!(out.final_.finish_reason, pb::FinishReason::Length as i32);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sampling_and_stop_strings_reach_the_engine() {
    let w = Worker::start(&Opts::vllm()).await;
    let mut c = w.client().await;
    let mut request = prompt_request("one two", 8);
    if let Some(r) = request.request.as_mut() {
        r.sampling = Some(pb::SamplingParams {
            temperature: 0.5,
            top_p: 0.9,
            top_k: 5,
            seed: Some(7),
        });
        r.stop = vec![" w3".into()];
    }
    let out = run(&mut c, request).await.unwrap();
    assert_eq!(out.text, " w0 w1 w2");
    assert_eq!(out.final_.finish_reason, pb::FinishReason::Stop as i32);
    assert!(
        w.stdout()
            .contains("temperature=0.5, top_p=0.9, top_k=5, seed=7, stop=[' w3'], max_tokens=8"),
        "{}",
        w.output()
    );
    // Greedy is said out loud (engines default to temperature 1).
    run(&mut c, prompt_request("greedy", 1)).await.unwrap();
    assert!(
        w.stdout()
            .contains("temperature=0.0, top_p=None, top_k=None, seed=None"),
        "{}",
        w.output()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prompt_too_long_for_the_context_is_invalid_argument() {
    let mut o = Opts::vllm();
    let n = o.engine.len();
    o.engine[n - 1] = "8".into(); // --max-model-len 8
    let w = Worker::start(&o).await;
    let mut c = w.client().await;
    let err = run(&mut c, prompt_request("a b c d e f g h i j", 4))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");
    assert!(
        err.message().contains("maximum context length is 8 tokens"),
        "{err:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_stream_aborts_the_request_in_the_engine() {
    let w = Worker::start(&Opts::vllm().env("STANDIN_TOKEN_DELAY_MS", "200")).await;
    let port = w.engine_port();
    let mut c = w.client().await;
    let mut stream = c
        .generate(prompt_request("keep going", 1000))
        .await
        .unwrap()
        .into_inner();
    let first = stream.message().await.unwrap().unwrap();
    assert!(matches!(
        first.chunk,
        Some(pb::generate_response::Chunk::Delta(_))
    ));
    assert_eq!(engine_gauge(port, "vllm:num_requests_running"), 1.0);
    let mut health = w.client().await;
    let active = |h: &pb::HealthResponse| h.active_sequences;
    let deadline = Instant::now() + Duration::from_secs(5);
    while active(
        &health
            .health(pb::HealthRequest {})
            .await
            .unwrap()
            .into_inner(),
    ) != 1
    {
        assert!(Instant::now() < deadline, "Health never showed the request");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop(stream);
    drop(c);
    // The engine's own gauge is the evidence: the request was aborted, not
    // left to run to its end (12 tokens at 200 ms would take 2.4 s).
    let dropped = Instant::now();
    wait_until(
        "the engine to abort the request",
        Duration::from_secs(5),
        || engine_gauge(port, "vllm:num_requests_running") == 0.0,
    );
    assert!(dropped.elapsed() < Duration::from_millis(1500));
    wait_until(
        "the abort in the engine's log",
        Duration::from_secs(5),
        || w.stdout().contains("Aborted request cmpl-"),
    );
    let deadline = Instant::now() + Duration::from_secs(5);
    while active(
        &health
            .health(pb::HealthRequest {})
            .await
            .unwrap()
            .into_inner(),
    ) != 0
    {
        assert!(Instant::now() < deadline, "Health kept the request");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_reports_running_and_waiting_from_the_engine_metrics() {
    let o = Opts::vllm()
        .env("STANDIN_HANG", "generate")
        .engine_arg("--max-num-seqs")
        .engine_arg("1");
    let w = Worker::start(&o).await;
    let mut streams = Vec::new();
    for i in 0..2 {
        let mut c = w.client().await;
        streams.push(tokio::spawn(async move {
            let _ = run(&mut c, prompt_request(&format!("request {i}"), 5)).await;
        }));
    }
    let mut c = w.client().await;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let h = c.health(pb::HealthRequest {}).await.unwrap().into_inner();
        assert_eq!(h.state, pb::WorkerState::Ready as i32);
        if (h.active_sequences, h.queued_sequences) == (1, 1) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "Health never showed 1 running and 1 waiting: {h:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for s in &streams {
        s.abort();
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let h = c.health(pb::HealthRequest {}).await.unwrap().into_inner();
        if (h.active_sequences, h.queued_sequences) == (0, 0) {
            break;
        }
        assert!(Instant::now() < deadline, "requests never ended: {h:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_drains_then_stops_the_engines_whole_process_group() {
    let o = Opts::vllm()
        .env("STANDIN_ENGINE_CORE", "1")
        .env("STANDIN_TOKEN_DELAY_MS", "200");
    let mut w = Worker::start(&o).await;
    let (engine, core) = (w.engine_pid(), w.core_pid());
    assert!(alive(engine) && alive(core));
    let mut c = w.client().await;
    // 10 tokens at 200 ms: a 2 s window for Health (read from the engine's
    // metrics) to show the request as active, even on a loaded machine.
    let running = tokio::spawn(async move { run(&mut c, prompt_request("finish me", 10)).await });
    let mut c = w.client().await;
    wait_active(&mut c, 1).await;
    let report = c
        .shutdown(pb::ShutdownRequest {
            drain_timeout_ms: 10_000,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((report.finished, report.cancelled), (1, 0));
    let out = running.await.unwrap().unwrap();
    assert_eq!(out.ids.len(), 10);
    let st = w.wait_exit(Duration::from_secs(20));
    assert_eq!(st.code(), Some(0), "{}", w.output());
    assert!(
        !group_alive(engine),
        "the engine's group outlived the worker"
    );
    assert!(!alive(core), "the EngineCore outlived the worker");
    assert!(!w.socket.exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_drain_timeout_cancels_what_is_still_running() {
    let mut w = Worker::start(&Opts::vllm().env("STANDIN_HANG", "generate")).await;
    let mut c = w.client().await;
    let stuck = tokio::spawn(async move { run(&mut c, prompt_request("never ends", 5)).await });
    let mut c = w.client().await;
    wait_active(&mut c, 1).await;
    let report = shutdown(&mut c, 300).await;
    assert_eq!((report.finished, report.cancelled), (0, 1));
    let out = stuck.await.unwrap().unwrap();
    assert_eq!(out.final_.finish_reason, pb::FinishReason::Cancelled as i32);
    assert_eq!(w.wait_exit(Duration::from_secs(20)).code(), Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_stops_the_engine_cleanly() {
    let mut w = Worker::start(&Opts::vllm().env("STANDIN_ENGINE_CORE", "1")).await;
    let (engine, core) = (w.engine_pid(), w.core_pid());
    kill(w.child.id() as i32, libc::SIGTERM);
    let st = w.wait_exit(Duration::from_secs(20));
    assert_eq!(st.code(), Some(0), "{}", w.output());
    assert!(
        w.stderr().contains("INFO:     Shutting down"),
        "{}",
        w.output()
    );
    assert!(!group_alive(engine) && !alive(core));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_that_ignores_sigterm_gets_sigkill_and_the_worker_exits_1() {
    let o = Opts::vllm()
        .env("STANDIN_IGNORE_SIGTERM", "1")
        .arg("--stop-timeout-secs")
        .arg("1");
    let mut w = Worker::start(&o).await;
    let engine = w.engine_pid();
    let mut c = w.client().await;
    c.shutdown(pb::ShutdownRequest {
        drain_timeout_ms: 100,
    })
    .await
    .unwrap();
    let st = w.wait_exit(Duration::from_secs(20));
    assert_eq!(st.code(), Some(1), "{}", w.output());
    assert!(
        w.stderr()
            .contains("did not exit within 1s of SIGTERM (--stop-timeout-secs); its process group got SIGKILL"),
        "{}",
        w.output()
    );
    assert!(!group_alive(engine));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_killed_by_sigkill_makes_the_worker_exit_137_naming_the_cause() {
    let mut w = Worker::start(&Opts::vllm().env("STANDIN_ENGINE_CORE", "1")).await;
    let (engine, core) = (w.engine_pid(), w.core_pid());
    kill(engine, libc::SIGKILL);
    let st = w.wait_exit(Duration::from_secs(20));
    assert_eq!(st.code(), Some(137), "{st:?}\n{}", w.output());
    let stderr = w.stderr();
    assert!(
        stderr.contains(&format!(
            "the engine `python3` (pid {engine}) was killed by SIGKILL (signal 9), which the worker did not send (the kernel's OOM killer sends SIGKILL, and so does `kill -9`"
        )),
        "{}",
        w.output()
    );
    // Its EngineCore, orphaned, went with it.
    assert!(!alive(core) && !group_alive(engine));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_core_death_while_serving_is_named_and_not_blamed_on_a_signal_it_cannot_see() {
    let mut w = Worker::start(&Opts::vllm().env("STANDIN_ENGINE_CORE", "1")).await;
    let (engine, core) = (w.engine_pid(), w.core_pid());
    kill(core, libc::SIGKILL);
    let st = w.wait_exit(Duration::from_secs(20));
    assert_eq!(st.code(), Some(1), "{st:?}\n{}", w.output());
    let stderr = w.stderr();
    assert!(
        stderr.contains(
            "tt-worker-openai: vLLM's EngineCore died under its API server while serving"
        ),
        "{}",
        w.output()
    );
    assert!(
        stderr.contains("MPClient: engine core exited unexpectedly")
            && stderr.contains("then exited with status 0")
            && !stderr.contains("OOM"),
        "{}",
        w.output()
    );
    assert!(!group_alive(engine));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_core_death_during_the_load_is_a_start_up_failure_not_a_signal() {
    let mut w = Worker::spawn(
        &Opts::vllm()
            .env("STANDIN_ENGINE_CORE", "1")
            .env("STANDIN_LOAD_SECS", "60"),
    );
    let core = w.core_pid();
    let info = w.info().await;
    assert!(info.is_none_or(|i| i.state == pb::WorkerState::Loading as i32));
    kill(core, libc::SIGKILL);
    let st = w.wait_exit(Duration::from_secs(20));
    assert_eq!(st.code(), Some(1), "{}", w.output());
    let stderr = w.stderr();
    assert!(
        stderr.contains("vLLM's engine core failed to start")
            && stderr.contains("Failed core proc(s): {}")
            && stderr.contains("no sign of a signal")
            && !stderr.contains("OOM"),
        "{}",
        w.output()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_engine_gets_the_cache_paths_and_a_cold_start_forces_the_model_load() {
    let names = "TT_CACHE_PATH,TT_METAL_CACHE,TT_TRANSFORMERS_FORCE_MODEL_LOAD,TT_VISIBLE_DEVICES,MESH_DEVICE";
    let cold = Worker::start(&Opts::vllm().mode("cold").env("STANDIN_PRINT_ENV", names)).await;
    let out = cold.stdout();
    let variant = cold.cache_dir().display().to_string();
    let model_dir = cold.cache_dir().parent().unwrap().display().to_string();
    assert!(
        out.contains(&format!("standin env TT_CACHE_PATH={variant}/weights")),
        "{out}"
    );
    assert!(
        out.contains(&format!(
            "standin env TT_METAL_CACHE={model_dir}/kernels-variant1"
        )),
        "{out}"
    );
    assert!(out.contains("standin env TT_TRANSFORMERS_FORCE_MODEL_LOAD=1"));
    assert!(out.contains("standin env TT_VISIBLE_DEVICES=0000:01:00.0"));
    assert!(out.contains("standin env MESH_DEVICE=(1,1)"));
    assert!(cold.cache_dir().join("weights").is_dir());

    let warm = Worker::start(&Opts::vllm().env("STANDIN_PRINT_ENV", names)).await;
    assert!(
        warm.stdout()
            .contains("standin env TT_TRANSFORMERS_FORCE_MODEL_LOAD=<unset>"),
        "{}",
        warm.output()
    );
    // An operator's own kernel cache stands.
    let own = Worker::start(
        &Opts::vllm()
            .env("STANDIN_PRINT_ENV", names)
            .env("TT_METAL_CACHE", "/tmp/my-kernels"),
    )
    .await;
    assert!(own
        .stdout()
        .contains("standin env TT_METAL_CACHE=/tmp/my-kernels"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn banners_reach_the_workers_stdout_and_info() {
    let o = Opts::vllm()
        .env("STANDIN_BANNERS", "FOO_FLAG,BAR_FLAG")
        .env("FOO_FLAG", "1")
        .env("BAR_FLAG", "0");
    let w = Worker::start(&o).await;
    let stdout = w.stdout();
    assert!(stdout.lines().any(|l| l == "FOO_FLAG engaged"), "{stdout}");
    assert!(!stdout.contains("BAR_FLAG engaged"));
    let info = w.info().await.unwrap();
    assert_eq!(info.banners_engaged, ["FOO_FLAG"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_worker_and_its_engine_die_with_their_parent() {
    // The daemon's place is taken by a shell; killing it must take the
    // worker and the engine's whole group with it.
    let dir = tempfile::tempdir().unwrap();
    let inner = command(&Opts::vllm().env("STANDIN_ENGINE_CORE", "1"), dir.path());
    let mut parent = std::process::Command::new("sh");
    parent
        .arg("-c")
        .arg("\"$0\" \"$@\" >\"$OUT\" 2>\"$ERR\" & wait")
        .arg(inner.get_program())
        .args(inner.get_args())
        .env_clear()
        .envs(inner.get_envs().filter_map(|(k, v)| Some((k, v?))))
        .env("OUT", dir.path().join("out"))
        .env("ERR", dir.path().join("err"));
    let mut shell = parent.spawn().unwrap();
    let read = |f: &str| std::fs::read_to_string(dir.path().join(f)).unwrap_or_default();
    let number_after = |marker: &str| -> i32 {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let all = read("out") + &read("err");
            if let Some(n) = tt_worker_contract::testing::number_after(&all, marker) {
                return n as i32;
            }
            assert!(Instant::now() < deadline, "no {marker}: {}", read("err"));
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    let engine = number_after("Started server process [");
    let core = number_after("(EngineCore_DP0 pid=");
    shell.kill().unwrap();
    shell.wait().unwrap();
    wait_until("the engine's group to die", Duration::from_secs(10), || {
        !group_alive(engine) && !alive(core)
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_that_never_gets_ready_is_stopped_at_the_deadline() {
    let o = Opts::vllm()
        .env("STANDIN_HANG", "load")
        .arg("--ready-timeout-secs")
        .arg("2");
    let mut w = Worker::spawn(&o);
    let st = w.wait_exit(Duration::from_secs(30));
    assert_eq!(st.code(), Some(1), "{}", w.output());
    let stderr = w.stderr();
    assert!(
        stderr.contains("the engine was not ready within 2s (--ready-timeout-secs)")
            && stderr.contains("Loading weights: layer 2/10"),
        "{}",
        w.output()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_exiting_0_unasked_makes_the_worker_exit_1() {
    let mut o = Opts::vllm();
    o.engine = ["sh", "-c", "echo engine up; exit 0", "{port}"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let mut w = Worker::spawn(&o);
    let st = w.wait_exit(Duration::from_secs(20));
    assert_eq!(st.code(), Some(1), "{}", w.output());
    assert!(
        w.stderr()
            .contains("exited with status 0 although the worker did not ask it to stop"),
        "{}",
        w.output()
    );
    assert!(w.stdout().contains("engine up"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_exiting_by_signal_keeps_the_signal_in_the_status() {
    let mut o = Opts::vllm();
    o.engine = ["sh", "-c", "kill -USR1 $$", "{port}"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let mut w = Worker::spawn(&o);
    let st = w.wait_exit(Duration::from_secs(20));
    assert_eq!(st.code(), Some(128 + libc::SIGUSR1), "{}", w.output());
    assert!(st.signal().is_none());
    assert!(
        w.stderr().contains("killed by SIGUSR1 (signal 10)"),
        "{}",
        w.output()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_that_is_not_installed_is_named() {
    let mut o = Opts::vllm();
    o.engine = ["/nonexistent/vllm", "serve", "--port", "{port}"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let mut w = Worker::spawn(&o);
    let st = w.wait_exit(Duration::from_secs(20));
    assert_eq!(st.code(), Some(1));
    assert!(
        w.stderr()
            .contains("cannot start the engine `/nonexistent/vllm`"),
        "{}",
        w.output()
    );
    assert!(!w.socket.exists());
}

#[test]
fn usage_errors_exit_2_and_say_what_to_fix() {
    let dir = tempfile::tempdir().unwrap();
    let mut o = Opts::vllm();
    o.engine = vec!["vllm".into(), "serve".into(), "m".into()];
    let out = command(&o, dir.path()).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("has no `{port}`"));

    let out = command(&Opts::vllm(), dir.path())
        .env_remove("TT_CACHE_MODE")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("missing TT_CACHE_MODE"));
}
