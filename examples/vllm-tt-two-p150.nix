# vLLM with the Tenstorrent plugin on two cabled P150a cards (TP=2, one 1x2
# mesh: MESH_DEVICE=(1,2)), supervised by tt-worker-openai, with the OpenAI
# front door on port 8000. vLLM-TT is installed on the host under
# /opt/tt-vllm (docs/ENGINES.md has the container form).
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

    models.qwen = {
      tp = 2;
      cards = [
        "0000:01:00.0"
        "0000:02:00.0"
      ];
      # A Hugging Face directory: its identity is its files' names, sizes
      # and mtimes.
      checkpoint = "/srv/models/Qwen3-32B";
      worker = [
        "${serving.package}/bin/tt-worker-openai"
        # The TT preset: HF_MODEL, --block-size 64, --max-num-batched-tokens
        # = --max-model-len, no tensor-parallel option, a 60 s stop grace.
        "--engine"
        "vllm-tt"
        "--"
        "/opt/tt-vllm/bin/vllm"
        "serve"
        "{checkpoint}"
        "--host"
        "127.0.0.1"
        "--port"
        "{port}"
        "--max-model-len"
        "34816"
        "--max-num-seqs"
        "8"
      ];
      flags.QWEN36_SDPA_STREAMING = "1";
      banners.patterns = [ "QWEN36_*" ];
      max_in_flight = 8;
      # A recovery takes minutes: refuse at once with a retry hint.
      recovery_wait_secs = 0;
      readiness = {
        deadline_secs = 3600;
        expect = "Paris";
      };
      restart = {
        # Above the worker's 60 s stop grace for a TT mesh close.
        stop_timeout_secs = 75;
        # Prefill on 2x P150a runs ~1,800 tokens/s; allow for far slower.
        min_prefill_tokens_per_sec = 200;
      };
    };
  };
}
