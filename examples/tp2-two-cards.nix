# One TP=2 model on two cabled P150a cards (one 1x2 mesh, MESH_DEVICE=(1,2)),
# served by a site's tt-metal engine. A cold build of a 27B model takes a
# quarter of an hour, so the readiness deadline is generous.
{
  services.tenstorrent-serving = {
    enable = true;

    models."qwen3.6-27b" = {
      tp = 2;
      # Rank order; PCI addresses stay the same across resets.
      cards = [
        "0000:01:00.0"
        "0000:02:00.0"
      ];
      checkpoint = "/srv/models/Qwen3.6-27B";
      worker = [
        "/opt/tt-inference/bin/tt-metal-worker"
        "--max-batch"
        "8"
      ];
      flags = {
        QWEN36_SDPA_STREAMING = "1";
        QWEN36_BFP8_MLP = "1";
      };
      # bfp8 MLP weights change the tensor cache files: a new variant.
      cache_flags = [ "QWEN36_BFP8_MLP" ];
      banners.patterns = [ "QWEN36_*" ];
      cold_env.TT_TRANSFORMERS_FORCE_MODEL_LOAD = "1";
      readiness = {
        deadline_secs = 3600;
        expect = "Paris";
      };
      restart.rss_limit_mib = 98304;
    };
  };
}
