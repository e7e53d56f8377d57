{
  description = "tt-serving: serve language models on Tenstorrent cards as one declarative NixOS service";

  inputs.nixpkgs.url = "github:NixOS/nixpkgs/nixos-unstable";

  outputs =
    { self, nixpkgs }:
    let
      inherit (nixpkgs) lib;
      systems = [
        "x86_64-linux"
        "aarch64-linux"
      ];
      forAllSystems = f: lib.genAttrs systems (system: f nixpkgs.legacyPackages.${system});

      workspace = (builtins.fromTOML (builtins.readFile ./Cargo.toml)).workspace.package;

      # The whole workspace: tt-servingd, ttctl, tt-worker, tt-worker-openai and tt-fakehw.
      # The protos compile with protox (pure Rust), so no protoc is needed.
      package =
        { lib, rustPlatform, stdenv }:
        rustPlatform.buildRustPackage {
          pname = "tt-serving";
          inherit (workspace) version;

          # Only what cargo reads: editing the docs, the module or the Nix
          # tests does not rebuild the package.
          src = lib.cleanSourceWith {
            name = "tt-serving-source";
            src = ./.;
            filter =
              path: type:
              let
                rel = lib.removePrefix "${toString ./.}/" (toString path);
              in
              lib.cleanSourceFilter path type
              && !(builtins.elem rel [
                ".ci"
                "bench/daemon/results.jsonl"
                "bench/engine"
                "docs"
                "examples"
                "flake.lock"
                "flake.nix"
                "module.nix"
                "result"
                "target"
                "tests/nix"
              ])
              && !(lib.hasSuffix ".gguf" rel);
          };

          cargoLock.lockFile = ./Cargo.lock;

          # Portable x86-64, no target-cpu: one build runs on every host it
          # is deployed to; tt-worker's kernels choose AVX2 at run time.

          # The workspace tests start the daemon, workers and fake hardware
          # as processes and take flock(1) locks; .ci/run runs them. The VM
          # test below exercises the built binaries end to end.
          doCheck = false;

          meta = {
            description = "Serve language models on Tenstorrent cards: the tt-servingd daemon, ttctl, the tt-worker engine and tt-fakehw";
            homepage = workspace.repository;
            license = lib.licenses.asl20;
            mainProgram = "tt-servingd";
            platforms = lib.platforms.linux;
          };
        };
    in
    {
      overlays.default = final: _prev: {
        tt-serving = final.callPackage package { };
      };

      packages = forAllSystems (pkgs: rec {
        tt-serving = pkgs.callPackage package { };
        default = tt-serving;
      });

      # The module, with the package from this flake. It sets no
      # nixpkgs.overlays, so it also works with read-only pkgs.
      nixosModules.default =
        { lib, pkgs, ... }:
        {
          imports = [ ./module.nix ];
          services.tenstorrent-serving.package =
            lib.mkDefault
              self.packages.${pkgs.stdenv.hostPlatform.system}.default;
        };
      nixosModules.tenstorrent-serving = self.nixosModules.default;

      apps = forAllSystems (
        pkgs:
        let
          pkg = self.packages.${pkgs.stdenv.hostPlatform.system}.default;
          app = bin: description: {
            type = "app";
            program = "${pkg}/bin/${bin}";
            meta = { inherit description; };
          };
        in
        rec {
          tt-servingd = app "tt-servingd" "The tt-serving daemon (run, check-config, print-example-config)";
          ttctl = app "ttctl" "Operate tt-servingd: status, card resets and loans, generate, logs, slots, cache";
          default = tt-servingd;
        }
      );

      devShells = forAllSystems (pkgs: {
        default = pkgs.mkShell {
          inputsFrom = [ self.packages.${pkgs.stdenv.hostPlatform.system}.default ];
          packages = with pkgs; [
            cargo
            rustc
            clippy
            rustfmt
            rust-analyzer
            util-linux # flock, for the integration tests
            python3 # tests/nix/run.sh
            nixfmt
          ];
          # tests/nix/run.sh evaluates module.nix with this nixpkgs' lib.
          NIXPKGS_LIB = "${nixpkgs}/lib";
        };
      });

      formatter = forAllSystems (pkgs: pkgs.nixfmt-tree);

      checks = forAllSystems (pkgs: {
        package = self.packages.${pkgs.stdenv.hostPlatform.system}.default;
        module-eval = import ./tests/nix/nixos-eval.nix { inherit pkgs self nixpkgs; };
        vm = import ./tests/nix/vm-test.nix { inherit pkgs self; };
      });
    };
}
