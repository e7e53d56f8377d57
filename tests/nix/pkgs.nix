# A stand-in for `pkgs`, just what module.nix uses: the package, tt-smi, the
# TOML format and runCommand. Nothing is built: "store paths" are names made
# from a hash of what the real function would put in the store, so a change
# of content changes the path (as restartTriggers rely on).
{
  lib,
  # Whether this "nixpkgs" has tt-smi.
  withTtSmi ? true,
}:
let
  inherit (lib) types;

  storePath =
    name: content:
    "/nix/store/${builtins.substring 0 32 (builtins.hashString "sha256" content)}-${name}";

  fakePackage =
    {
      pname,
      version,
      mainProgram,
    }:
    {
      type = "derivation";
      name = "${pname}-${version}";
      inherit pname version;
      outPath = storePath "${pname}-${version}" pname;
      meta = {
        inherit mainProgram;
      };
    };

  # The same value type as nixpkgs' `formats.toml`.
  tomlValue =
    types.nullOr (
      types.oneOf [
        types.bool
        types.int
        types.float
        types.str
        types.path
        (types.attrsOf tomlValue)
        (types.listOf tomlValue)
      ]
    )
    // {
      description = "TOML value";
    };
in
{
  tt-serving = fakePackage {
    pname = "tt-serving";
    version = "0.1.0";
    mainProgram = "tt-servingd";
  };

  formats.toml =
    { }:
    {
      type = types.attrsOf tomlValue;
      generate = name: value: storePath name (builtins.toJSON value);
    };

  runCommand = name: env: script: storePath name script;

  docker-client = fakePackage {
    pname = "docker-client";
    version = "27.3.1";
    mainProgram = "docker";
  };
}
// lib.optionalAttrs withTtSmi {
  tt-smi = fakePackage {
    pname = "tt-smi";
    version = "3.0.27";
    mainProgram = "tt-smi";
  };
}
