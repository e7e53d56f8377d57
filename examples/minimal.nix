# The smallest useful host: one small model on one card with the project's
# reference engine (tt-worker). Everything else is the daemon's default.
{
  services.tenstorrent-serving = {
    enable = true;
    models.smollm2 = {
      tp = 1;
      cards = [ 0 ];
      checkpoint = "/var/lib/tt-serving/models/SmolLM2-135M-Instruct.Q4_1.gguf";
    };
  };
}
