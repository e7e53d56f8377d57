# Flake check `module-eval`: the module evaluated as part of real NixOS
# systems (nixpkgs from the flake's input), one per host config in
# examples/. Building it renders each config with the real
# `pkgs.formats.toml` and checks it with `tt-servingd check-config --offline`
# (the module's checkConfig). The configs in broken/ must fail evaluation's
# assertions, and those in invalid/ must evaluate and then fail that
# build-time check, each with the message on its `# expect:` line.
{
  pkgs,
  self,
  nixpkgs,
}:
let
  inherit (pkgs) lib;

  # The least a NixOS system needs to evaluate.
  base = {
    nixpkgs.hostPlatform = pkgs.stdenv.hostPlatform.system;
    boot.loader.grub.enable = false;
    fileSystems."/" = {
      device = "/dev/vda";
      fsType = "ext4";
    };
    system.stateVersion = lib.trivial.release;
  };

  evalHost =
    file:
    (nixpkgs.lib.nixosSystem {
      modules = [
        self.nixosModules.default
        base
        file
      ];
    }).config;

  failedAssertions = config: map (a: a.message) (lib.filter (a: !a.assertion) config.assertions);

  nixFiles = dir: lib.filter (lib.hasSuffix ".nix") (lib.attrNames (builtins.readDir dir));

  good = map (
    name:
    let
      config = evalHost (../../examples + "/${name}");
      failed = failedAssertions config;
    in
    if failed != [ ] then
      throw "examples/${name}: ${lib.concatStringsSep "\n" failed}"
    else
      {
        name = "${lib.removeSuffix ".nix" name}.toml";
        path = config.environment.etc."tt-serving/config.toml".source;
      }
  ) (nixFiles ../../examples);

  expectOf =
    file:
    let
      line = lib.findFirst (lib.hasPrefix "# expect: ") (throw "${file}: no '# expect: ' line") (
        lib.splitString "\n" (builtins.readFile file)
      );
    in
    lib.removePrefix "# expect: " line;

  rejected = map (
    name:
    let
      file = ./broken + "/${name}";
      expected = expectOf file;
      failed = failedAssertions (evalHost file);
    in
    if lib.any (lib.hasInfix expected) failed then
      "${name}: ${expected}"
    else
      throw "tests/nix/broken/${name}: no assertion says `${expected}`; got: ${lib.concatStringsSep "; " failed}"
  ) (nixFiles ./broken);

  # The daemon's validator is the module's: building the config file runs
  # check-config, which must fail saying what the `# expect:` line says.
  invalid = map (
    name:
    let
      file = ./invalid + "/${name}";
      config = evalHost file;
      failure = pkgs.testers.testBuildFailure config.environment.etc."tt-serving/config.toml".source;
    in
    if failedAssertions config != [ ] then
      throw "tests/nix/invalid/${name}: an assertion fails (move it to broken/): ${lib.concatStringsSep "; " (failedAssertions config)}"
    else
      {
        name = "invalid-${name}";
        path = pkgs.runCommand "tt-serving-invalid-${lib.removeSuffix ".nix" name}" { } ''
          grep -F -- ${lib.escapeShellArg (expectOf file)} ${failure}/testBuildFailure.log
          touch $out
        '';
      }
  ) (nixFiles ./invalid);
in
pkgs.linkFarm "tt-serving-module-eval" (
  good
  ++ invalid
  ++ [
    {
      name = "broken-configs-rejected";
      path = pkgs.writeText "broken-configs-rejected" (lib.concatLines rejected);
    }
  ]
)
