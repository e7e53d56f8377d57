# What a `nixos-rebuild switch` would do to the unit, per kind of change:
# evaluates examples/minimal.nix as is, with a model flag changed, and with a
# daemon-level setting changed, and returns each evaluation's restart and
# reload triggers. run.sh checks that a model change only moves the reload
# trigger (switch-to-configuration then reloads), a daemon-level change
# moves the restart trigger (it restarts), and a model's env_file
# changes the unit's LoadCredential= (it restarts: systemd copies
# credentials at start).
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
      # Any other change to the unit makes the switch restart it.
      credentials = unit.serviceConfig.LoadCredential or [ ];
    };
in
{
  base = triggers { };
  modelChange = triggers {
    services.tenstorrent-serving.models.smollm2.flags.TTW_KV_F16 = "1";
  };
  daemonChange = triggers {
    services.tenstorrent-serving.settings.daemon.tick_ms = 500;
  };
  envFileChange = triggers {
    services.tenstorrent-serving.models.smollm2.env_file = "/run/secrets/smollm2.env";
  };
}
