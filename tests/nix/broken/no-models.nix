# expect: services.tenstorrent-serving is enabled but no model is configured; add one
{
  services.tenstorrent-serving.enable = true;
}
