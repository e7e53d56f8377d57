# NixOS VM test (flake check `vm`): boot a machine with the service on the
# fake hardware root, wait until the daemon reports ready (Type=notify:
# every slot passed its readiness ping), then use it as an operator would.
{ pkgs, self }:
pkgs.testers.runNixOSTest {
  name = "tt-serving";

  nodes.machine = {
    imports = [
      self.nixosModules.default
      ./vm-host.nix
    ];
    virtualisation.memorySize = 2048;
    virtualisation.cores = 2;
  };

  testScript = ''
    machine.wait_for_unit("tt-fakehw-firmware.service")
    machine.wait_for_unit("tenstorrent-serving.service", timeout=600)

    with subtest("ttctl status, as a member of the tenstorrent group"):
        status = machine.succeed("su -l operator -c 'ttctl status'")
        print(status)
        assert "tiny" in status, "slot tiny missing from ttctl status"
        assert "0000:01:00.0" in status and "0000:02:00.0" in status, "cards missing"
        # Delegate=yes: each slot in a cgroup of its own, memory accounted.
        assert "slots contained by: cgroup v2 at " in status, "the slots are not in cgroups"
        assert "(memory accounted)" in status, "the memory controller was not handed down"
        machine.succeed("for p in $(pgrep -P $(systemctl show -P MainPID tenstorrent-serving.service)); do cat /proc/$p/cgroup; done | grep -q '/slot-tiny$'")

    with subtest("the control socket is closed to other users"):
        machine.fail("su -l outsider -c 'ttctl status'")

    with subtest("ttctl generate answers with the tiny model"):
        answer = machine.succeed("su -l operator -c 'ttctl generate tiny \"The capital of France is\" --max-tokens 8'")
        print(answer)
        assert answer.strip(), "empty answer"

    with subtest("the rendered config is installed and valid"):
        machine.succeed("tt-servingd check-config --offline /etc/tt-serving/config.toml")

    with subtest("a restart stops cleanly and comes back warm"):
        machine.succeed("systemctl restart tenstorrent-serving.service")
        machine.wait_for_unit("tenstorrent-serving.service", timeout=600)
        machine.succeed("su -l operator -c 'ttctl generate tiny \"Hello\" --max-tokens 4'")
        machine.succeed("journalctl -u tenstorrent-serving.service --no-pager | grep -i warm")
  '';
}
