# Two TP=1 models side by side, one card each, both on the reference engine
# (tt-worker, GGUF checkpoints). Cards named by index for brevity; the daemon
# resolves them to PCI addresses when it starts.
{
  services.tenstorrent-serving = {
    enable = true;

    models.smollm2 = {
      tp = 1;
      cards = [ 0 ];
      checkpoint = "/var/lib/tt-serving/models/SmolLM2-135M-Instruct.Q4_1.gguf";
      flags.TTW_KV_F16 = "1";
      banners.patterns = [ "TTW_*" ];
      readiness.expect = "Paris";
    };

    models.smollm2-q8 = {
      tp = 1;
      cards = [ 1 ];
      checkpoint = "/var/lib/tt-serving/models/SmolLM2-135M-Instruct.Q4_1.gguf";
      flags = {
        TTW_MLP_DOWN_Q8 = "1";
        TTW_KV_F16 = "0";
      };
      # Q8_0 down projections are stored differently in the tensor cache.
      cache_flags = [ "TTW_MLP_DOWN_Q8" ];
      # A/B arm: the f16 KV banner must not show while the flag is off.
      banners = {
        patterns = [ "TTW_*" ];
        mode = "both";
      };
      max_queue = 16;
    };
  };
}
