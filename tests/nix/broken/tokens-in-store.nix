# expect: services.tenstorrent-serving.tokensFile = "/nix/store/0000000000000000000000000000000-tokens" is in the Nix store, which every local user can read
{
  services.tenstorrent-serving = {
    enable = true;
    tokensFile = "/nix/store/0000000000000000000000000000000-tokens";
    models.smollm2 = {
      tp = 1;
      cards = [ 0 ];
      checkpoint = "/var/lib/tt-serving/models/smollm2.gguf";
    };
  };
}
