# expect: models.smollm2.flags.TTW_KV_F16: invalid type: boolean `true`, expected a string
# Flags are environment variables: strings, as the daemon reads them ("1",
# "0"). The module used to turn booleans into "1"/"0"; now the file says
# what the daemon reads, and check-config names the key.
{
  imports = [ ../../../examples/minimal.nix ];
  services.tenstorrent-serving.models.smollm2.flags.TTW_KV_F16 = true;
}
