# expect: services.tenstorrent-serving.models.smollm2.env_file = "/nix/store/0000000000000000000000000000000-smollm2.env" is in the Nix store, which every local user can read
{
  imports = [ ../../../examples/minimal.nix ];
  services.tenstorrent-serving.models.smollm2.env_file = "/nix/store/0000000000000000000000000000000-smollm2.env";
}
