# Evaluates module.nix through the real module system (nixpkgs' lib from
# NIXPKGS_LIB) with the stand-ins in stubs.nix and pkgs.nix, for one host
# config, and returns what the harness checks, as JSON-able data:
#
#   nix-instantiate --store dummy:// --eval --strict --json tests/nix/eval.nix \
#     --argstr libPath "$NIXPKGS_LIB" --argstr example "$PWD/examples/tp2-two-cards.nix"
#
# Only lib.evalModules and ordinary lib functions are used (no lib.fileset:
# Nix 2.8 lacks builtins.readFileType).
{
  libPath,
  example,
  # "full": settings, TOML and units; "assertions": only the failed
  # assertions and warnings (for the deliberately broken configs).
  mode ? "full",
  withTenstorrentOption ? true,
  withTtSmi ? true,
}:
let
  lib = import (/. + libPath);
  pkgs = import ./pkgs.nix { inherit lib withTtSmi; };
  toml = import ./toml.nix;

  evaluated = lib.evalModules {
    modules = [
      (import ./stubs.nix { inherit withTenstorrentOption; })
      ../../module.nix
      (/. + example)
      { _module.args.pkgs = pkgs; }
    ];
  };
  c = evaluated.config;
  cfg = c.services.tenstorrent-serving;

  # hugepages.count: what it is, its default (tested against 4 per card
  # whether or not the host sets it) and whether the host set it.
  countOption = evaluated.options.services.tenstorrent-serving.hugepages.count;

  failedAssertions = map (a: a.message) (builtins.filter (a: !a.assertion) c.assertions);

  # Store paths of the stand-in packages become their names, so the JSON is
  # readable; everything else is data already.
  unit = name: c.systemd.services.${name} or null;
in
if mode == "assertions" then
  {
    inherit failedAssertions;
    inherit (c) warnings;
  }
else
  {
    inherit failedAssertions;
    inherit (c) warnings;
    settings = cfg.finalSettings;
    toml = toml.render cfg.finalSettings;
    unit = unit "tenstorrent-serving";
    hugepagesUnit = unit "tenstorrent-hugepages";
    mounts = c.systemd.mounts;
    tmpfiles = c.systemd.tmpfiles.rules;
    users = c.users.users;
    groups = c.users.groups;
    kernelParams = c.boot.kernelParams;
    hugepages = {
      inherit (cfg.hugepages) enable count;
      defaultCount = countOption.default;
      # mkOptionDefault (1500) is the priority of an option's `default`.
      countIsDefault = countOption.highestPrio >= 1500;
    };
    firewallTCPPorts = c.networking.firewall.allowedTCPPorts;
    etc = c.environment.etc;
    environmentVariables = c.environment.variables;
    systemPackages = map (p: p.name) c.environment.systemPackages;
    hardwareTenstorrentEnable = if withTenstorrentOption then c.hardware.tenstorrent.enable else null;
    package = "${cfg.package}";
    inherit (cfg) containerRuntime;
    inherit (c) virtualisation;
  }
