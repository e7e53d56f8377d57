# expect: models.smollm2.env.TT_VISIBLE_DEVICES: `TT_VISIBLE_DEVICES` is set by the daemon for every worker
{
  imports = [ ../../../examples/minimal.nix ];
  services.tenstorrent-serving.models.smollm2.env.TT_VISIBLE_DEVICES = "0000:01:00.0";
}
