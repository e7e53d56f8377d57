# expect: services.tenstorrent-serving.models.smollm2.env_file = "/nix/store/0000000000000000000000000000000-smollm2.env" is in the Nix store, which every local user can read
{
  services.tenstorrent-serving = {
    enable = true;
    models.smollm2 = {
      tp = 1;
      cards = [ 0 ];
      checkpoint = "/var/lib/tt-serving/models/smollm2.gguf";
      env_file = "/nix/store/0000000000000000000000000000000-smollm2.env";
    };
  };
}
