# The NixOS host the systemd guest stands for (tests/systemd_guest.rs):
# module.nix evaluated with this file gives the unit, the config, the
# tmpfiles rules and the users the guest installs. tests/nix/run.sh renders
# them into tests/guest/ (TT_NIX_WRITE_GUEST=1) and fails when the files
# there differ from what the module renders.
{
  # The guest's systemd: Debian 12's (scripts/guest.sh).
  systemd.package.version = "252.39";
  services.tenstorrent-serving = {
    enable = true;
    # No 1 GiB hugepages in a 2 GiB guest, and no engine that needs them.
    hugepages.enable = false;
    models.smollm2 = {
      tp = 1;
      cards = [ 0 ];
      checkpoint = "/srv/models/smollm2.gguf";
      # Software emulation loads the model in about 20 s; room for a cold start.
      readiness.deadline_secs = 600;
    };
    settings = {
      # The fake cards tt-fakehw lays out (no Tenstorrent card in a guest):
      # what `tt-fakehw create --root /var/lib/tt-fakehw` prints.
      hardware = {
        dev_root = "/var/lib/tt-fakehw/dev";
        sys_root = "/var/lib/tt-fakehw/sys";
        proc_root = "/var/lib/tt-fakehw/proc";
        tt_smi = "/var/lib/tt-fakehw/bin/tt-smi";
      };
      reset.policy = "always";
    };
  };
}
