//! Who may do what: the control socket's rules (peer credentials), bearer
//! tokens and TLS on the public port, and the request limits. Real daemon,
//! real sockets, real `ttctl` run as other users; the tests that switch
//! users need root (they say SKIPPED otherwise).

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};
use tonic::{Code, Request};
use tt_serving_proto::v1::control_client::ControlClient;
use tt_serving_proto::v1::generate_request::Input;
use tt_serving_proto::v1::inference_client::InferenceClient;
use tt_serving_proto::v1::{
    ChatMessage, ChatMessages, GenerateRequest, ListModelsRequest, StatusRequest,
};
use tt_serving_tests::{
    bin, model_table, needs_root, output_text, run_to_exit, tiny_model, Daemon, DaemonOptions,
    FakeHw,
};

/// `nobody`/`nogroup`: an unprivileged user and its group on Debian-like
/// systems; the socket is given to the group.
const NOBODY: u32 = 65534;
const NOGROUP: &str = "nogroup";
/// `daemon`: an unprivileged user in neither group.
const OUTSIDER: u32 = 1;

const TOKEN: &str = "tok-3f9a1c77d2e04b5a9e61";

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Runtime::new().expect("tokio runtime")
}

/// A daemon whose control socket belongs to `nogroup`, with `daemon_extra`
/// added to `[daemon]`, reachable by other users (the temp dir is 0700).
fn daemon_for_users(hw: &FakeHw, daemon_extra: &str) -> Daemon {
    let daemon = Daemon::start(
        hw,
        DaemonOptions {
            daemon_extra: format!("control_socket_group = \"{NOGROUP}\"\n{daemon_extra}"),
            ..Default::default()
        },
    );
    std::fs::set_permissions(&daemon.dir, std::fs::Permissions::from_mode(0o711)).unwrap();
    daemon
}

#[test]
fn a_socket_group_member_may_read_but_not_reset_without_the_admin_group() {
    needs_root!();
    let hw = FakeHw::new(1);
    let daemon = daemon_for_users(&hw, "");
    let status = daemon.ttctl_as(NOBODY, NOBODY, &["status", "--json"]);
    assert!(status.status.success(), "{}", output_text(&status));

    let reset = daemon.ttctl_as(NOBODY, NOBODY, &["card", "reset", "0"]);
    let text = output_text(&reset);
    assert_eq!(reset.status.code(), Some(1), "{text}");
    assert!(
        text.contains("ttctl card reset needs root (set daemon.control_admin_group to let a group's members use it); uid 65534 (nobody) is not root"),
        "{text}"
    );
    let reload = daemon.ttctl_as(NOBODY, NOBODY, &["reload"]);
    assert_eq!(reload.status.code(), Some(1), "{}", output_text(&reload));
    assert!(output_text(&reload).contains("ttctl reload needs root"));
    // A dry run changes nothing, so reading is enough; it is not recorded
    // either (a reader must not be able to push real reloads out of the
    // history).
    // The file is root's: the reader sees which key changes, not to what.
    let mut text = std::fs::read_to_string(&daemon.config).unwrap();
    text.push_str("\n[host]\nram_floor_mib = 3333\n");
    std::fs::write(&daemon.config, text).unwrap();
    let dry = daemon.ttctl_as(NOBODY, NOBODY, &["reload", "--dry-run"]);
    let text = output_text(&dry);
    assert!(dry.status.success(), "{text}");
    assert!(text.contains("dry run: nothing applied"), "{text}");
    assert!(text.contains("host.ram_floor_mib: changed"), "{text}");
    assert!(!text.contains("3333"), "{text}");
    let root = output_text(&daemon.ttctl(&["reload", "--dry-run"]));
    assert!(root.contains("host.ram_floor_mib: 4096 → 3333"), "{root}");
    let status = daemon.status();
    assert_eq!(
        status["reloads"].as_array().map(Vec::len).unwrap_or(0),
        0,
        "{status}"
    );
    assert!(hw.smi_calls().is_empty(), "nothing was reset");
    assert!(daemon.log_text().contains("control operation refused"));
}

#[test]
fn admin_group_members_may_reset_and_others_are_told_the_rule() {
    needs_root!();
    let hw = FakeHw::new(1);
    // The admin group is checked by primary group here, by supplementary
    // group below.
    let daemon = daemon_for_users(&hw, &format!("control_admin_group = \"{NOGROUP}\"\n"));
    let reset = daemon.ttctl_as(NOBODY, NOBODY, &["card", "reset", "0"]);
    assert!(reset.status.success(), "{}", output_text(&reset));
    assert_eq!(hw.smi_calls().len(), 1, "{:?}", hw.smi_calls());

    // A supplementary member: uid 1 with group 65534 added, as login
    // shells get it. setpriv sets exactly these groups.
    if Command::new("setpriv").arg("--version").output().is_ok() {
        let out = Command::new("setpriv")
            .args(["--reuid=1", "--regid=1", "--groups=65534", "--"])
            .arg(bin("ttctl"))
            .arg("--socket")
            .arg(&daemon.socket)
            .args(["card", "reset", "0"])
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", output_text(&out));
        assert_eq!(hw.smi_calls().len(), 2);
    } else {
        eprintln!("note: setpriv not installed; supplementary groups not exercised");
    }

    // root may do anything; the daemon log records who did it.
    let out = daemon.ttctl(&["card", "reset", "0"]);
    assert!(out.status.success(), "{}", output_text(&out));
    assert!(daemon.log_text().contains("control operation allowed"));
}

#[test]
fn admin_group_refusal_names_the_group_and_the_caller() {
    needs_root!();
    let hw = FakeHw::new(1);
    // `root` as the admin group: nobody is not in it.
    let daemon = daemon_for_users(&hw, "control_admin_group = \"root\"\n");
    let out = daemon.ttctl_as(NOBODY, NOBODY, &["slot", "restart", "x"]);
    let text = output_text(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains("ttctl slot restart needs root or membership in group `root` (daemon.control_admin_group); uid 65534 (nobody) is in neither"),
        "{text}"
    );
    for (verb, command) in [("stop", "ttctl slot stop"), ("start", "ttctl slot start")] {
        let out = daemon.ttctl_as(NOBODY, NOBODY, &["slot", verb, "x"]);
        let text = output_text(&out);
        assert_eq!(out.status.code(), Some(1), "{text}");
        assert!(
            text.contains(&format!(
                "{command} needs root or membership in group `root`"
            )),
            "{text}"
        );
    }
}

#[test]
fn a_user_outside_the_socket_group_cannot_connect() {
    needs_root!();
    let hw = FakeHw::new(1);
    let daemon = daemon_for_users(&hw, "");
    let out = daemon.ttctl_as(OUTSIDER, OUTSIDER, &["status"]);
    let text = output_text(&out);
    assert_eq!(out.status.code(), Some(3), "{text}");
    assert!(text.contains("permission denied on"), "{text}");
}

#[test]
fn a_missing_admin_group_stops_the_daemon_with_the_fix() {
    let hw = FakeHw::new(1);
    let dir = tempfile::tempdir().unwrap();
    let opts = DaemonOptions {
        daemon_extra: "control_admin_group = \"no-such-group-tt\"\n".into(),
        ..Default::default()
    };
    let daemon = Daemon::configure(&hw, dir.path(), &opts);
    let text = run_to_exit(&daemon.config);
    assert!(
        text.contains("group `no-such-group-tt` (daemon.control_admin_group) does not exist"),
        "{text}"
    );
}

/// A tokens file with the right mode.
fn tokens_file(dir: &Path, mode: u32) -> std::path::PathBuf {
    let path = dir.join("tokens");
    std::fs::write(&path, format!("# clients\n\n{TOKEN}\nsecond-token-xyz\n")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
    path
}

/// A model whose worker never starts (no such checkpoint): requests that
/// pass validation are answered UNAVAILABLE, without a worker.
fn idle_model() -> String {
    format!(
        "[models.small]\ntp = 1\ncards = [\"{}\"]\ncheckpoint = \"/nonexistent/s.gguf\"\n",
        FakeHw::bdf(0)
    )
}

fn with_token<T>(message: T, token: &str) -> Request<T> {
    let mut request = Request::new(message);
    request.metadata_mut().insert(
        "authorization",
        format!("Bearer {token}").parse().expect("ASCII token"),
    );
    request
}

fn prompt_request(prompt: &str, max_tokens: u32) -> GenerateRequest {
    GenerateRequest {
        model: "small".into(),
        input: Some(Input::Prompt(prompt.into())),
        max_tokens,
        ..Default::default()
    }
}

async fn plain_channel(address: &str) -> Channel {
    Endpoint::from_shared(format!("http://{address}"))
        .unwrap()
        .connect()
        .await
        .expect("connect to the inference port")
}

#[test]
fn tokens_guard_inference_and_reflection_but_not_health() {
    let hw = FakeHw::new(1);
    let secrets = tempfile::tempdir().unwrap();
    let tokens = tokens_file(secrets.path(), 0o640);
    let daemon = Daemon::start(
        &hw,
        DaemonOptions {
            extra: format!(
                "[inference]\ntokens_file = \"{}\"\n{}",
                tokens.display(),
                idle_model()
            ),
            // Debug logging: even then the token must not appear.
            env: vec![("RUST_LOG".into(), "debug".into())],
            ..Default::default()
        },
    );
    let address = daemon.inference_address();
    runtime().block_on(async {
        let channel = plain_channel(&address).await;
        let mut inference = InferenceClient::new(channel.clone());

        let missing = inference
            .list_models(ListModelsRequest {})
            .await
            .expect_err("no token");
        assert_eq!(missing.code(), Code::Unauthenticated);
        assert!(
            missing.message().contains("authorization: Bearer <token>"),
            "{}",
            missing.message()
        );
        assert!(missing.message().contains("inference.tokens_file"));

        let wrong = inference
            .generate(with_token(prompt_request("hi", 4), "tok-wrong"))
            .await
            .expect_err("wrong token");
        assert_eq!(wrong.code(), Code::Unauthenticated);
        assert!(
            wrong.message().contains("not accepted"),
            "{}",
            wrong.message()
        );

        let models = inference
            .list_models(with_token(ListModelsRequest {}, TOKEN))
            .await
            .expect("the right token is answered")
            .into_inner();
        assert_eq!(models.models[0].name, "small");
        // Past authentication, the request reaches the router.
        let routed = inference
            .generate(with_token(prompt_request("hi", 4), "second-token-xyz"))
            .await
            .expect_err("no ready slot");
        assert_eq!(routed.code(), Code::Unavailable, "{routed}");

        // Health stays open for load balancers.
        use tonic_health::pb::health_check_response::ServingStatus;
        use tonic_health::pb::{health_client::HealthClient, HealthCheckRequest};
        let health = HealthClient::new(channel.clone())
            .check(HealthCheckRequest {
                service: String::new(),
            })
            .await
            .expect("health without a token")
            .into_inner();
        assert_eq!(health.status, ServingStatus::Serving as i32);

        // Reflection needs the token.
        assert_eq!(
            list_services(channel.clone(), None)
                .await
                .unwrap_err()
                .code(),
            Code::Unauthenticated
        );
        // It lists exactly what this port serves: no Control, no Engine.
        let mut services = list_services(channel.clone(), Some(TOKEN)).await.unwrap();
        services.sort();
        assert_eq!(
            services,
            [
                "grpc.health.v1.Health",
                "grpc.reflection.v1.ServerReflection",
                "tt.serving.v1.Inference"
            ]
        );

        // No control operation is served on the TCP port, token or not.
        let control = ControlClient::new(channel)
            .status(with_token(StatusRequest {}, TOKEN))
            .await
            .expect_err("Control is not served on the public port");
        assert_eq!(control.code(), Code::Unimplemented, "{control}");
    });
    let log = daemon.log_text();
    assert!(log.contains("requires a bearer token"), "{log}");
    assert!(!log.contains(TOKEN), "the token appears in the daemon log");
    assert!(!log.contains("second-token-xyz"));
    assert!(!log.contains("tok-wrong"));
}

async fn list_services(
    channel: Channel,
    token: Option<&str>,
) -> Result<Vec<String>, tonic::Status> {
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
    use tonic_reflection::pb::v1::ServerReflectionRequest;
    let outgoing = tokio_stream::iter(vec![ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    }]);
    let request = match token {
        Some(t) => with_token(outgoing, t),
        None => Request::new(outgoing),
    };
    let mut responses = ServerReflectionClient::new(channel)
        .server_reflection_info(request)
        .await?
        .into_inner();
    match responses.message().await?.and_then(|r| r.message_response) {
        Some(MessageResponse::ListServicesResponse(list)) => {
            Ok(list.service.into_iter().map(|s| s.name).collect())
        }
        other => panic!("unexpected reflection reply {other:?}"),
    }
}

#[test]
fn a_world_readable_tokens_file_stops_the_daemon_with_the_fix() {
    let hw = FakeHw::new(1);
    let dir = tempfile::tempdir().unwrap();
    let tokens = tokens_file(dir.path(), 0o644);
    let opts = DaemonOptions {
        extra: format!("[inference]\ntokens_file = \"{}\"\n", tokens.display()),
        ..Default::default()
    };
    let daemon = Daemon::configure(&hw, dir.path(), &opts);
    let text = run_to_exit(&daemon.config);
    assert!(text.contains(&tokens.display().to_string()), "{text}");
    assert!(text.contains("inference.tokens_file"), "{text}");
    assert!(text.contains("every local user can read it"), "{text}");
    assert!(text.contains("chmod o-rwx"), "{text}");
    assert!(!text.contains(TOKEN), "{text}");
    assert!(!daemon.socket.exists(), "refused before binding anything");
}

/// A CA and a server certificate for `localhost` and 127.0.0.1 signed by
/// it, made with openssl; returns (ca.pem, cert.pem, key.pem) paths.
fn make_certificates(
    dir: &Path,
) -> Option<(std::path::PathBuf, std::path::PathBuf, std::path::PathBuf)> {
    let openssl = |args: &[&str]| {
        let out = Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .output()
            .ok()?;
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            output_text(&out)
        );
        Some(())
    };
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];
    let mut ca = vec![
        "req",
        "-x509",
        "-days",
        "2",
        "-subj",
        "/CN=tt-serving test CA",
    ];
    ca.extend(ec);
    ca.extend(["-keyout", "ca.key", "-out", "ca.pem"]);
    openssl(&ca)?;
    let mut csr = vec!["req", "-new", "-subj", "/CN=localhost"];
    csr.extend(ec);
    csr.extend(["-keyout", "key.pem", "-out", "server.csr"]);
    openssl(&csr)?;
    std::fs::write(
        dir.join("ext.cnf"),
        "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage=serverAuth\nsubjectAltName=DNS:localhost,IP:127.0.0.1\n",
    )
    .unwrap();
    openssl(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-days",
        "2",
        "-extfile",
        "ext.cnf",
        "-out",
        "cert.pem",
    ])?;
    let key = dir.join("key.pem");
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    Some((dir.join("ca.pem"), dir.join("cert.pem"), key))
}

#[test]
fn tls_serves_clients_that_trust_the_ca_and_refuses_plaintext() {
    let secrets = tempfile::tempdir().unwrap();
    let Some((ca, cert, key)) = make_certificates(secrets.path()) else {
        eprintln!("SKIPPED: openssl is not installed");
        return;
    };
    let hw = FakeHw::new(1);
    let tokens = tokens_file(secrets.path(), 0o600);
    let daemon = Daemon::start(
        &hw,
        DaemonOptions {
            extra: format!(
                "[inference]\ntokens_file = \"{}\"\ntls_cert = \"{}\"\ntls_key = \"{}\"\n{}",
                tokens.display(),
                cert.display(),
                key.display(),
                idle_model()
            ),
            ..Default::default()
        },
    );
    let port = daemon
        .inference_address()
        .rsplit(':')
        .next()
        .unwrap()
        .to_string();
    let ca = std::fs::read(ca).unwrap();
    runtime().block_on(async {
        let tls = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(&ca))
            .domain_name("localhost");
        // The daemon listens on 127.0.0.1; the certificate's name is
        // checked as `localhost`.
        let channel = Endpoint::from_shared(format!("https://127.0.0.1:{port}"))
            .unwrap()
            .tls_config(tls)
            .unwrap()
            .connect()
            .await
            .expect("TLS connection with the CA");
        let models = InferenceClient::new(channel)
            .list_models(with_token(ListModelsRequest {}, TOKEN))
            .await
            .expect("answered over TLS")
            .into_inner();
        assert_eq!(models.models.len(), 1);

        // Plaintext HTTP/2 to the TLS port gets nowhere.
        let plain = async {
            let channel = Endpoint::from_shared(format!("http://127.0.0.1:{port}"))
                .unwrap()
                .connect_timeout(Duration::from_secs(5))
                .timeout(Duration::from_secs(5))
                .connect()
                .await
                .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
            InferenceClient::new(channel)
                .list_models(with_token(ListModelsRequest {}, TOKEN))
                .await
        };
        assert!(plain.await.is_err(), "a plaintext client was answered");
    });
}

/// The OpenAI front door serves TLS from the same certificate and key as
/// the gRPC port: curl trusting the CA gets the models list (with a token),
/// plaintext HTTP gets no answer.
#[test]
fn the_openai_port_serves_tls_with_the_same_certificate_and_tokens() {
    let secrets = tempfile::tempdir().unwrap();
    let Some((ca, cert, key)) = make_certificates(secrets.path()) else {
        eprintln!("SKIPPED: openssl is not installed");
        return;
    };
    let hw = FakeHw::new(1);
    let tokens = tokens_file(secrets.path(), 0o600);
    let daemon = Daemon::start(
        &hw,
        DaemonOptions {
            extra: format!(
                "[openai]\nlisten = \"127.0.0.1:0\"\n[inference]\ntokens_file = \"{}\"\ntls_cert = \"{}\"\ntls_key = \"{}\"\n{}",
                tokens.display(),
                cert.display(),
                key.display(),
                idle_model()
            ),
            ..Default::default()
        },
    );
    let address = daemon.status()["daemon"]["openai_address"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let port = address.rsplit(':').next().unwrap_or_default().to_string();
    let curl = |scheme: &str, token: Option<&str>| {
        let mut cmd = Command::new("curl");
        cmd.args(["-sS", "--max-time", "10", "--cacert"]).arg(&ca);
        // The certificate names `localhost`; the daemon listens on 127.0.0.1.
        cmd.args(["--resolve", &format!("localhost:{port}:127.0.0.1")]);
        if let Some(token) = token {
            cmd.args(["-H", &format!("Authorization: Bearer {token}")]);
        }
        cmd.arg(format!("{scheme}://localhost:{port}/v1/models"))
            .output()
            .expect("run curl")
    };
    let models = curl("https", Some(TOKEN));
    let text = output_text(&models);
    assert!(models.status.success(), "{text}");
    let body: serde_json::Value =
        serde_json::from_slice(&models.stdout).unwrap_or_else(|e| panic!("{e}: {text}"));
    assert_eq!(body["data"][0]["id"], "small", "{body}");
    let no_token = curl("https", None);
    assert!(
        String::from_utf8_lossy(&no_token.stdout).contains("authentication_error"),
        "{}",
        output_text(&no_token)
    );
    let plain = curl("http", Some(TOKEN));
    assert!(
        !String::from_utf8_lossy(&plain.stdout).contains("\"data\""),
        "plaintext HTTP was answered: {}",
        output_text(&plain)
    );
}

#[test]
fn oversize_prompts_and_max_tokens_are_refused_before_any_worker() {
    let hw = FakeHw::new(1);
    let daemon = Daemon::start(
        &hw,
        DaemonOptions {
            extra: format!(
                "[limits]\nmax_prompt_bytes = 1024\nmax_tokens = 64\n{}",
                idle_model()
            ),
            ..Default::default()
        },
    );
    let address = daemon.inference_address();
    runtime().block_on(async {
        let mut inference = InferenceClient::new(plain_channel(&address).await);
        let long = "x".repeat(1025);
        let err = inference
            .generate(prompt_request(&long, 4))
            .await
            .expect_err("prompt over the limit");
        assert_eq!(err.code(), Code::InvalidArgument, "{err}");
        assert!(
            err.message().starts_with("prompt: 1025 bytes"),
            "{}",
            err.message()
        );
        assert!(
            err.message().contains("limits.max_prompt_bytes"),
            "{}",
            err.message()
        );

        let chat = GenerateRequest {
            model: "small".into(),
            input: Some(Input::Chat(ChatMessages {
                messages: vec![
                    ChatMessage {
                        role: "system".into(),
                        content: "y".repeat(600),
                    },
                    ChatMessage {
                        role: "user".into(),
                        content: "z".repeat(600),
                    },
                ],
            })),
            ..Default::default()
        };
        let err = inference
            .generate(chat)
            .await
            .expect_err("chat over the limit");
        assert_eq!(err.code(), Code::InvalidArgument, "{err}");
        assert!(
            err.message()
                .starts_with("chat.messages[].content: 1200 bytes"),
            "{}",
            err.message()
        );

        let err = inference
            .generate(prompt_request("hi", 65))
            .await
            .expect_err("max_tokens over the limit");
        assert_eq!(err.code(), Code::InvalidArgument, "{err}");
        assert!(
            err.message().starts_with("max_tokens: 65"),
            "{}",
            err.message()
        );
        assert!(
            err.message().contains("limits.max_tokens"),
            "{}",
            err.message()
        );

        // A prompt far beyond the limit (2 MB against 1 KiB) is refused
        // from the message's length prefix, before the daemon holds it, with
        // the same kind of answer, not the decoder's OUT_OF_RANGE.
        let err = inference
            .generate(prompt_request(&"x".repeat(2 << 20), 4))
            .await
            .expect_err("a 2 MB prompt");
        assert_eq!(err.code(), Code::InvalidArgument, "{err}");
        assert!(err.message().starts_with("prompt: "), "{}", err.message());
        assert!(
            err.message()
                .contains("limit of 1024 bytes (limits.max_prompt_bytes)"),
            "{}",
            err.message()
        );
        assert!(err.message().contains("shorten the prompt"), "{}", err.message());
        // The connection is still good for the next request.
        let err = inference
            .generate(prompt_request("hi", 4))
            .await
            .expect_err("no ready slot");
        assert_eq!(err.code(), Code::Unavailable, "{err}");

        // A model name of a megabyte is refused as such, not echoed back
        // (which overflowed the response's metadata and broke the stream).
        let err = inference
            .generate(GenerateRequest {
                model: "m".repeat(1_000_000),
                ..prompt_request("hi", 4)
            })
            .await
            .expect_err("an absurd model name");
        assert_eq!(err.code(), Code::InvalidArgument, "{err}");
        assert!(
            err.message()
                .starts_with("model: a name of 1000000 bytes cannot name a model"),
            "{}",
            err.message()
        );
        assert!(err.message().len() < 200, "{}", err.message());

        // Chat roles are the three the templates know; stop strings are
        // limited in number.
        let roles = GenerateRequest {
            model: "small".into(),
            input: Some(Input::Chat(ChatMessages {
                messages: ["system", "user", "assistant", "tool"]
                    .iter()
                    .map(|role| ChatMessage {
                        role: role.to_string(),
                        content: "hi".into(),
                    })
                    .collect(),
            })),
            ..Default::default()
        };
        let err = inference.generate(roles).await.expect_err("role `tool`");
        assert_eq!(err.code(), Code::InvalidArgument, "{err}");
        assert!(
            err.message().starts_with(
                "chat.messages[3].role: `tool` is not a chat role; use one of system, user, assistant"
            ),
            "{}",
            err.message()
        );
        let err = inference
            .generate(GenerateRequest {
                stop: vec!["x".into(); 10_000],
                ..prompt_request("hi", 4)
            })
            .await
            .expect_err("10,000 stop strings");
        assert_eq!(err.code(), Code::InvalidArgument, "{err}");
        assert!(
            err.message().starts_with("stop: 10000 stop strings")
                && err.message().contains("limits.max_stop_strings"),
            "{}",
            err.message()
        );

        // At the limits the request passes validation and only then finds
        // no ready slot: the checks come first.
        let err = inference
            .generate(prompt_request(&"x".repeat(1024), 64))
            .await
            .expect_err("no ready slot");
        assert_eq!(err.code(), Code::Unavailable, "{err}");
    });
    // The same limits hold on the control socket's generate.
    let out = daemon.ttctl(&["generate", "small", &"x".repeat(2000)]);
    let text = output_text(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("limits.max_prompt_bytes"), "{text}");
    // A long name on the control socket is quoted cut, with its length.
    let out = daemon.ttctl(&["logs", &"s".repeat(100_000)]);
    let text = output_text(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains(&format!(
            "no slot `{}… (100000 bytes in all)`",
            "s".repeat(64)
        )),
        "{text}"
    );
    assert!(text.len() < 1000, "{text}");
}

#[test]
fn streams_beyond_the_per_connection_limit_are_resource_exhausted() {
    let hw = FakeHw::new(1);
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path());
    // The hang keeps every admitted stream open.
    let extra = "env = { TTW_TEST_FAULTS = \"1\", TTW_FAULT_HANG_AFTER_TOKENS = \"6\" }\n[models.m.restart]\nstall_timeout_secs = 60\n[models.m.readiness]\nconcurrency = 1\n";
    let daemon = Daemon::start(
        &hw,
        DaemonOptions {
            extra: format!(
                "[limits]\nmax_streams_per_connection = 2\n{}",
                model_table("m", 1, &[0], &model, extra)
            ),
            ..Default::default()
        },
    );
    daemon.wait_slot_state("m", "ready");
    let address = daemon.inference_address();
    runtime().block_on(async {
        let channel = plain_channel(&address).await;
        let request = || GenerateRequest {
            model: "m".into(),
            input: Some(Input::Prompt("hello".into())),
            max_tokens: 64,
            ..Default::default()
        };
        let mut open = Vec::new();
        for _ in 0..2 {
            let stream = InferenceClient::new(channel.clone())
                .generate(request())
                .await
                .expect("within the limit")
                .into_inner();
            open.push(stream);
        }
        wait_until_async(|| daemon.slot("m")["requests_in_flight"] == 2).await;
        let err = InferenceClient::new(channel.clone())
            .generate(request())
            .await
            .expect_err("a third stream on the same connection");
        assert_eq!(err.code(), Code::ResourceExhausted, "{err}");
        assert!(
            err.message()
                .contains("limits.max_streams_per_connection = 2"),
            "{}",
            err.message()
        );
        // Refused before routing, and counted under the key (anonymous:
        // no tokens here) as the router counts RESOURCE_EXHAUSTED.
        let m = tt_serving_tests::chaos_support::scrape(&daemon);
        let full = |name: &str, key: &[(&str, &str)]| {
            let mut labels = vec![("model", "m"), ("outcome", "queue_full")];
            labels.extend_from_slice(key);
            m.sum(name, &labels)
        };
        assert_eq!(
            full("tt_serving_key_requests_total", &[("key", "anonymous")]),
            1.0
        );
        assert_eq!(full("tt_serving_requests_total", &[]), 1.0);
        // The limit is per connection: another connection is served.
        let other = plain_channel(&address).await;
        let third = InferenceClient::new(other)
            .generate(request())
            .await
            .expect("another connection has its own places");
        // Closing a stream frees its place on the first connection.
        drop(open.pop());
        let again = wait_until_ok(|| {
            let channel = channel.clone();
            async move { InferenceClient::new(channel).generate(request()).await.ok() }
        })
        .await;
        drop((open, third, again));
    });
}

async fn wait_until_async(mut condition: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + tt_serving_tests::DEADLINE;
    while !condition() {
        assert!(tokio::time::Instant::now() < deadline, "timed out");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn wait_until_ok<T, F: std::future::Future<Output = Option<T>>>(
    mut attempt: impl FnMut() -> F,
) -> T {
    let deadline = tokio::time::Instant::now() + tt_serving_tests::DEADLINE;
    loop {
        if let Some(v) = attempt().await {
            return v;
        }
        assert!(tokio::time::Instant::now() < deadline, "timed out");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A model's `env_file` reaches its worker's environment (read from the
/// worker process itself), its values stay out of the daemon's log and
/// status, and a file every user can read fails the start with the fix.
#[test]
fn a_models_env_file_reaches_the_worker_and_nowhere_else() {
    let hw = FakeHw::new(1);
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path());
    let env_file = dir.path().join("m.env");
    std::fs::write(
        &env_file,
        "# licence for the engine\nexport ENGINE_LICENCE=\"lic-7f3a9c\"\n",
    )
    .unwrap();
    std::fs::set_permissions(&env_file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let extra = format!(
        "env_file = \"{}\"\n[models.m.restart]\nmax_attempts = 1\n",
        env_file.display()
    );
    let daemon = Daemon::start(
        &hw,
        DaemonOptions {
            extra: model_table("m", 1, &[0], &model, &extra),
            ..Default::default()
        },
    );
    let ready = daemon.wait_slot_state("m", "ready");
    let pid = ready["worker_pid"].as_u64().expect("worker pid");
    let environ = std::fs::read(format!("/proc/{pid}/environ")).expect("worker environ");
    let vars: Vec<String> = environ
        .split(|&b| b == 0)
        .map(|v| String::from_utf8_lossy(v).into_owned())
        .collect();
    assert!(
        vars.iter().any(|v| v == "ENGINE_LICENCE=lic-7f3a9c"),
        "{vars:?}"
    );
    let status = output_text(&daemon.ttctl(&["status", "--json"]));
    assert!(!status.contains("lic-7f3a9c"), "{status}");

    // Made readable by everyone: the next start refuses it and says how to
    // fix it, without the value.
    std::fs::set_permissions(&env_file, std::fs::Permissions::from_mode(0o644)).unwrap();
    // ttctl follows the restart and reports the refusal itself.
    let out = daemon.ttctl(&["slot", "restart", "m"]);
    let said = output_text(&out);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(said.contains("chmod o-rwx"), "{said}");
    assert!(!said.contains("lic-7f3a9c"), "{said}");
    let failed = daemon.wait_slot_state("m", "failed");
    let reason = failed["reason"].as_str().unwrap_or("");
    assert!(reason.contains("chmod o-rwx"), "{failed}");
    assert!(reason.contains("models.m.env_file"), "{failed}");
    let log = daemon.log_text();
    assert!(!log.contains("lic-7f3a9c"), "the secret reached the log");
}
