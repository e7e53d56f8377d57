# expect: services.tenstorrent-serving.port = 443 is a privileged port; the daemon runs as tt-serving without CAP_NET_BIND_SERVICE. Use a port from 1024 to 65535
{
  imports = [ ../../../examples/minimal.nix ];
  services.tenstorrent-serving.port = 443;
}
