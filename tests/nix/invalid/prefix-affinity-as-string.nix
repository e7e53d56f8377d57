# expect: models.smollm2.prefix_affinity: invalid type: string "on", expected a boolean
# A model's own keys pass through `models` untyped; check-config at build
# time names the key whose value the daemon cannot read.
{
  imports = [ ../../../examples/four-cards-mixed.nix ];
  services.tenstorrent-serving.models.smollm2.prefix_affinity = "on";
}
