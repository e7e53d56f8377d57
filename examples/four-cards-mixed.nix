# A four-card host serving other machines: a TP=2 model on the cabled pair
# and two TP=1 replicas of a small model on the other two cards, with engine
# flags, banner rules, a cold-build environment, a site probe after resets,
# JSON logs for the log shipper, bearer tokens and TLS on the public port,
# an admin group for destructive ttctl commands, and tighter request limits.
{
  services.tenstorrent-serving = {
    enable = true;
    listenAddress = "0.0.0.0";
    port = 50051;
    openFirewall = true;
    # RUST_LOG=info,tt_servingd=debug,tt_serving_host=debug and the like, kept out of the store.
    environmentFile = "/run/secrets/tt-serving.env";
    # Other machines connect: bearer tokens over TLS, files kept out of the
    # store (root-owned is fine: systemd hands them over as credentials).
    tokensFile = "/run/secrets/tt-serving-tokens";
    tls.certFile = "/var/lib/acme/llm.example.org/fullchain.pem";
    tls.keyFile = "/var/lib/acme/llm.example.org/key.pem";
    # Operators in tt-admin (and tenstorrent) may reset cards and reload.
    adminGroup = "tt-admin";
    hugepages.count = 4;

    settings = {
      daemon.log_format = "json";
      daemon.ready_when = "any";
      limits = {
        max_prompt_bytes = 131072;
        max_tokens = 2048;
      };
      reset = {
        policy = "always";
        probe_command = [
          "/opt/tt-inference/bin/mesh-open-check"
          "--timeout"
          "60"
        ];
        attempts = 4;
      };
    };

    models."qwen3.6-27b" = {
      tp = 2;
      cards = [
        "0000:01:00.0"
        "0000:02:00.0"
      ];
      checkpoint = "/srv/models/Qwen3.6-27B";
      worker = [ "/opt/tt-inference/bin/tt-metal-worker" ];
      mesh_device = "(1,2)";
      flags = {
        QWEN36_SDPA_STREAMING = "1";
        QWEN36_PAGED_KV = "1";
        QWEN36_TRACE_DECODE = "0";
      };
      cache_flags = [ "QWEN36_PAGED_KV" ];
      banners = {
        patterns = [ "QWEN36_*" ];
        mode = "both";
      };
      env.TT_METAL_LOGGER_LEVEL = "WARNING";
      # The engine's licence key: read by the daemon at every worker start,
      # never in the store or the logs.
      env_file = "/run/secrets/qwen-worker.env";
      cold_env.TT_TRANSFORMERS_FORCE_MODEL_LOAD = "1";
      readiness = {
        deadline_secs = 3600;
        ping_prompt = "Q: What is the capital of France?\nA: \"";
        ping_max_tokens = 8;
        expect = "Paris";
      };
      restart = {
        max_attempts = 3;
        stall_timeout_secs = 300;
        rss_limit_mib = 98304;
        stop_timeout_secs = 60;
      };
      drain_timeout_secs = 120;
      max_queue = 256;
    };

    models.smollm2 = {
      tp = 1;
      replicas = [
        [ "03:00.0" ]
        [ "0000:04:00.0" ]
      ];
      checkpoint = "/var/lib/tt-serving/models/SmolLM2-135M-Instruct.Q4_1.gguf";
      flags.TTW_KV_F16 = "1";
      banners.patterns = [ "TTW_*" ];
      readiness.expect = "Paris";
    };
  };
}
