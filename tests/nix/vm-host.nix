# The host of the NixOS VM test (vm-test.nix): the service on a fake
# hardware root made by tt-fakehw, with the tiny test model. Kept apart from
# the VM-only settings so that run.sh can evaluate it and check its rendered
# config with tt-servingd check-config, like the examples.
{
  config,
  lib,
  options,
  ...
}:
let
  package = config.services.tenstorrent-serving.package;
  fake = "/var/lib/tt-fakehw";
  root = "${fake}/root";
in
{
  services.tenstorrent-serving = {
    enable = true;
    # A small VM has no 1 GiB pages to spare, and the reference engine does
    # not need them.
    hugepages.enable = false;
    settings.hardware = {
      dev_root = "${root}/dev";
      sys_root = "${root}/sys";
      proc_root = "${root}/proc";
      tt_smi = "${root}/bin/tt-smi";
    };
    settings.reset.policy = "always";
    models.tiny = {
      tp = 2;
      cards = [
        "0000:01:00.0"
        "0000:02:00.0"
      ];
      checkpoint = "${fake}/tiny.gguf";
      readiness.deadline_secs = 300;
    };
  };

  # No card, no driver: keep the kernel module out where nixpkgs has it.
  hardware = lib.optionalAttrs (options ? hardware.tenstorrent.enable) {
    tenstorrent.enable = false;
  };

  users.users.operator = {
    isNormalUser = true;
    extraGroups = [ "tenstorrent" ];
  };
  users.users.outsider.isNormalUser = true;

  # The fake root and the test model, before the daemon (and again at every
  # boot: --force replaces the previous root).
  systemd.services.tt-fakehw-setup = {
    description = "Fake Tenstorrent hardware root and tiny test model";
    wantedBy = [ "multi-user.target" ];
    requiredBy = [
      "tenstorrent-serving.service"
      "tt-fakehw-firmware.service"
    ];
    before = [
      "tenstorrent-serving.service"
      "tt-fakehw-firmware.service"
    ];
    serviceConfig = {
      Type = "oneshot";
      RemainAfterExit = true;
      User = "tt-serving";
      Group = "tt-serving";
      StateDirectory = "tt-fakehw";
    };
    script = ''
      ${package}/bin/tt-fakehw create --root ${root} --cards 2 --force
      ${package}/bin/tt-worker make-test-model --out ${fake}/tiny.gguf
    '';
  };

  # Heartbeats advance and reset cards come back only while this runs.
  systemd.services.tt-fakehw-firmware = {
    description = "Fake Tenstorrent card firmware";
    wantedBy = [ "multi-user.target" ];
    requiredBy = [ "tenstorrent-serving.service" ];
    after = [ "tt-fakehw-setup.service" ];
    before = [ "tenstorrent-serving.service" ];
    serviceConfig = {
      User = "tt-serving";
      Group = "tt-serving";
      StateDirectory = "tt-fakehw";
      ExecStart = "${package}/bin/tt-fakehw firmware --root ${root}";
      Restart = "always";
    };
  };

  # The fake tt-smi writes the reset into the fake root.
  systemd.services.tenstorrent-serving.serviceConfig.ReadWritePaths = [ fake ];
}
