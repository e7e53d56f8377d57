# What a `nixos-rebuild switch` would do to the unit, per kind of change:
# evaluates examples/minimal.nix as is, with a model flag changed, and with a
# daemon-level setting changed, and returns each evaluation's restart and
# reload triggers. run.sh checks that a model change only moves the reload
# trigger (switch-to-configuration then reloads) and a daemon-level change
# moves the restart trigger (it restarts).
{ libPath }:
let
  lib = import (/. + libPath);
  pkgs = import ./pkgs.nix {
    inherit lib;
    withTtSmi = true;
  };
  triggers =
    extra:
    let
      c =
        (lib.evalModules {
          modules = [
            (import ./stubs.nix { withTenstorrentOption = true; })
            ../../module.nix
            ../../examples/minimal.nix
            extra
            { _module.args.pkgs = pkgs; }
          ];
        }).config;
      unit = c.systemd.services.tenstorrent-serving;
    in
    {
      restart = map toString unit.restartTriggers;
      reload = map toString unit.reloadTriggers;
    };
in
{
  base = triggers { };
  modelChange = triggers {
    services.tenstorrent-serving.models.smollm2.flags.TTW_KV_F16 = true;
  };
  daemonChange = triggers {
    services.tenstorrent-serving.settings.daemon.tick_ms = 500;
  };
}
