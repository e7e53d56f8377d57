# expect: services.tenstorrent-serving.port = 443 is a privileged port; the daemon runs as tt-serving without CAP_NET_BIND_SERVICE. Use a port from 1024 to 65535
{
  services.tenstorrent-serving = {
    enable = true;
    port = 443;
    models.smollm2 = {
      tp = 1;
      cards = [ 0 ];
      checkpoint = "/var/lib/tt-serving/models/smollm2.gguf";
    };
  };
}
