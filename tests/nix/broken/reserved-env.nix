# expect: services.tenstorrent-serving.models.smollm2.extraEnvironment.TT_VISIBLE_DEVICES: `TT_VISIBLE_DEVICES` is set by the daemon for every worker; remove it from extraEnvironment.
{
  services.tenstorrent-serving = {
    enable = true;
    models.smollm2 = {
      tp = 1;
      cards = [ 0 ];
      checkpoint = "/var/lib/tt-serving/models/smollm2.gguf";
      extraEnvironment.TT_VISIBLE_DEVICES = "0000:01:00.0";
    };
  };
}
