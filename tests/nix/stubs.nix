# Stand-ins for the few NixOS options module.nix sets, declared with types
# close to NixOS's own so that a value NixOS would reject (a null in
# serviceConfig, a string where a list is expected) fails here too.
{
  # Whether this "nixpkgs" has hardware.tenstorrent (newer ones do).
  withTenstorrentOption ? true,
}:
{ lib, ... }:
let
  inherit (lib) mkOption types;
  freeform = types.submodule { freeformType = types.attrsOf types.anything; };
  # NixOS's unit option values: a primitive or a list of them (no null).
  primitive = types.oneOf [
    types.bool
    types.int
    types.str
    types.path
  ];
  unitOption = types.either primitive (types.listOf primitive);
  unitModule = {
    freeformType = types.attrsOf types.anything;
    options = {
      description = mkOption {
        type = types.str;
        default = "";
      };
      wantedBy = mkOption {
        type = types.listOf types.str;
        default = [ ];
      };
      requiredBy = mkOption {
        type = types.listOf types.str;
        default = [ ];
      };
      after = mkOption {
        type = types.listOf types.str;
        default = [ ];
      };
      before = mkOption {
        type = types.listOf types.str;
        default = [ ];
      };
      wants = mkOption {
        type = types.listOf types.str;
        default = [ ];
      };
      requires = mkOption {
        type = types.listOf types.str;
        default = [ ];
      };
      unitConfig = mkOption {
        type = types.attrsOf unitOption;
        default = { };
      };
    };
  };
  serviceModule = {
    imports = [ unitModule ];
    options = {
      serviceConfig = mkOption {
        type = types.attrsOf unitOption;
        default = { };
      };
      environment = mkOption {
        type = types.attrsOf (
          types.nullOr (
            types.oneOf [
              types.str
              types.path
              types.package
            ]
          )
        );
        default = { };
      };
      path = mkOption {
        type = types.listOf (types.either types.package types.str);
        default = [ ];
      };
      restartTriggers = mkOption {
        type = types.listOf types.unspecified;
        default = [ ];
      };
      reloadTriggers = mkOption {
        type = types.listOf types.unspecified;
        default = [ ];
      };
      script = mkOption {
        type = types.lines;
        default = "";
      };
    };
  };
  mountModule = {
    imports = [ unitModule ];
    options = {
      what = mkOption { type = types.str; };
      where = mkOption { type = types.str; };
      type = mkOption {
        type = types.str;
        default = "";
      };
      options = mkOption {
        type = types.commas;
        default = "";
      };
      mountConfig = mkOption {
        type = types.attrsOf unitOption;
        default = { };
      };
    };
  };
in
{
  options = {
    assertions = mkOption {
      type = types.listOf types.unspecified;
      default = [ ];
    };
    warnings = mkOption {
      type = types.listOf types.str;
      default = [ ];
    };
    # virtualisation.docker / virtualisation.podman (containerRuntime).
    virtualisation = mkOption {
      type = freeform;
      default = { };
    };
    boot.kernelParams = mkOption {
      type = types.listOf types.str;
      default = [ ];
    };
    environment.etc = mkOption {
      type = types.attrsOf freeform;
      default = { };
    };
    environment.systemPackages = mkOption {
      type = types.listOf types.package;
      default = [ ];
    };
    environment.variables = mkOption {
      type = types.attrsOf types.str;
      default = { };
    };
    networking.firewall.allowedTCPPorts = mkOption {
      type = types.listOf types.port;
      default = [ ];
    };
    users.users = mkOption {
      type = types.attrsOf freeform;
      default = { };
    };
    users.groups = mkOption {
      type = types.attrsOf freeform;
      default = { };
    };
    systemd.services = mkOption {
      type = types.attrsOf (types.submodule serviceModule);
      default = { };
    };
    systemd.mounts = mkOption {
      type = types.listOf (types.submodule mountModule);
      default = [ ];
    };
    systemd.tmpfiles.rules = mkOption {
      type = types.listOf types.str;
      default = [ ];
    };
    # NixOS's systemd package; the module reads only its version. The
    # default: NixOS 24.11's systemd. A host file may set another.
    systemd.package = mkOption {
      type = types.attrsOf types.anything;
      default = {
        version = "256.8";
      };
    };
  }
  // lib.optionalAttrs withTenstorrentOption {
    hardware.tenstorrent.enable = mkOption {
      type = types.bool;
      default = false;
    };
  };
}
