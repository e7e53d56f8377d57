# vLLM with the Tenstorrent plugin (upstream vLLM 0.25.1 + vllm-tt-plugin)
# on two cabled P150a cards (TP=2, one 1x2 mesh: MESH_DEVICE=(1,2)),
# supervised by tt-worker-openai, with the OpenAI front door on port 8000.
# vLLM-TT is installed on the host under /opt/tt-vllm. The settings are
# tt-inference-server's model spec for Llama-3.1-8B-Instruct on a P300 (two
# Blackhole chips as one 1x2 mesh; it has no 2x P150 spec):
# docs/ENGINES.md has the sources, the recipe from a spec and the container
# form.
{ config, ... }:
let
  serving = config.services.tenstorrent-serving;
in
{
  services.tenstorrent-serving = {
    enable = true;

    # The OpenAI front door; openFirewall covers the gRPC port only, so open
    # 8000 in networking.firewall where clients are off the host.
    settings.openai.listen = "0.0.0.0:8000";

    models.llama = {
      tp = 2;
      cards = [
        "0000:01:00.0"
        "0000:02:00.0"
      ];
      # A Hugging Face directory: its identity is its files' names, sizes
      # and mtimes.
      checkpoint = "/srv/models/Llama-3.1-8B-Instruct";
      worker = [
        "${serving.package}/bin/tt-worker-openai"
        # The TT preset: HF_MODEL, the launcher's environment, --block-size
        # 64, --max-num-batched-tokens = --max-model-len, `tt` below as
        # --additional-config, no tensor-parallel option, a 60 s stop
        # grace, the paged-attention KV files declared as runtime cache
        # files.
        "--engine"
        "vllm-tt"
        "--"
        "/opt/tt-vllm/bin/python"
        "-m"
        "vllm.entrypoints.openai.api_server"
        "--model"
        "{checkpoint}"
        "--host"
        "127.0.0.1"
        "--port"
        "{port}"
        "--max-model-len"
        "131072"
        "--max-num-seqs"
        "32"
        "--seed"
        "9472"
      ];
      # The spec's override_tt_config: vllm-tt-plugin's settings, checked
      # by name, passed as --additional-config '{"tt": {...}}'.
      tt = {
        sample_on_device_mode = "decode_only";
        trace_region_size = 56000000;
      };
      # The spec's system_requirements (STRICT): check-config and every
      # start refuse a card or driver below them.
      requires = {
        firmware = "19.2.0";
        kmd = "2.5.0";
      };
      # = --max-num-seqs: the daemon admits what vLLM batches.
      max_in_flight = 32;
      # A recovery takes minutes: refuse at once with a retry hint.
      recovery_wait_secs = 0;
      readiness = {
        deadline_secs = 3600;
        expect = "Paris";
        # tt-inference-server's padded lengths up to the context: no
        # client meets a length's first-use compile.
        warmup_prompt_tokens = [ 128 256 512 1024 2048 4096 8192 16384 32640 65408 130944 ];
      };
      restart = {
        # Above the worker's 60 s stop grace for a TT mesh close
        # (check-config refuses less).
        stop_timeout_secs = 75;
        # An unwarmed length compiles silently for up to a minute.
        stall_timeout_secs = 180;
        # Prefill on 2x P150a runs ~1,800 tokens/s; allow for far slower.
        min_prefill_tokens_per_sec = 200;
      };
    };
  };
}
