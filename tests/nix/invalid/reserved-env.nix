# expect: models.smollm2.env.TT_VISIBLE_DEVICES: `TT_VISIBLE_DEVICES` is set by the daemon for every worker
{
  services.tenstorrent-serving = {
    enable = true;
    models.smollm2 = {
      tp = 1;
      cards = [ 0 ];
      checkpoint = "/var/lib/tt-serving/models/smollm2.gguf";
      env.TT_VISIBLE_DEVICES = "0000:01:00.0";
    };
  };
}
