# expect: services.tenstorrent-serving.tokensFile = "/nix/store/0000000000000000000000000000000-tokens" is in the Nix store, which every local user can read
{
  imports = [ ../../../examples/minimal.nix ];
  services.tenstorrent-serving.tokensFile = "/nix/store/0000000000000000000000000000000-tokens";
}
