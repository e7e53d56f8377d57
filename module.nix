# NixOS module for tt-serving: `services.tenstorrent-serving`.
#
# Renders the daemon's TOML config from free-form `settings` and `models`
# in the file's own keys (RFC 0042; `tt-servingd print-example-config`
# shows them all), checks it with `tt-servingd check-config --offline` at
# build time, and runs `tt-servingd` as a hardened systemd service that owns
# the host's Tenstorrent cards. Typed options exist only where Nix needs
# them: the package, secrets, the port, groups, directories, hugepages.
# Everything else (TP against cards, a card used twice, environment names,
# ranges) is the daemon's validator's job, run on the rendered file.
# Documentation: docs/nixos.md.
{
  config,
  lib,
  options,
  pkgs,
  ...
}:
let
  inherit (lib)
    literalExpression
    mkDefault
    mkIf
    mkMerge
    mkOption
    types
    ;

  cfg = config.services.tenstorrent-serving;
  settingsFormat = pkgs.formats.toml { };

  # Daemon defaults the module needs for the unit's timeouts, as in
  # host/src/config/schema.rs (the rendered file leaves unset keys out, so
  # the daemon's own defaults apply there).
  daemonDefaults = {
    tick_ms = 1000;
    deadline_secs = 1800;
    drain_timeout_secs = 30;
    stop_timeout_secs = 20;
  };

  # Drop nulls ("use the daemon's default") and the tables they leave empty.
  prune =
    v:
    if builtins.isAttrs v && !lib.isDerivation v then
      lib.filterAttrs (_: x: x != null && x != { }) (lib.mapAttrs (_: prune) v)
    else if builtins.isList v then
      map prune v
    else
      v;

  # A directory systemd creates for us (StateDirectory= and friends) when it
  # lies under `base`; null otherwise.
  managedDir =
    base: path:
    if lib.hasPrefix "${base}/" path && path != "${base}/" then lib.removePrefix "${base}/" path else null;

  # Secret files reach the daemon through LoadCredential=: systemd copies each
  # one (root-only is fine) into a directory only the service's user can
  # read, whatever ProtectHome=/ProtectSystem= hide. Credential id -> the
  # option naming the file, and its path on the host.
  credentialsDir = "/run/credentials/tenstorrent-serving.service";
  secrets = lib.filterAttrs (_: s: s.path != null) (
    {
      tokens = {
        option = "tokensFile";
        path = cfg.tokensFile;
      };
      tls-cert = {
        option = "tls.certFile";
        path = cfg.tls.certFile;
      };
      tls-key = {
        option = "tls.keyFile";
        path = cfg.tls.keyFile;
      };
    }
    // lib.mapAttrs' (
      name: m:
      lib.nameValuePair "model-${name}-env" {
        option = "models.${lib.strings.escapeNixIdentifier name}.env_file";
        path = m.env_file;
      }
    ) cfg.models
  );
  credential = id: if secrets ? ${id} then "${credentialsDir}/${id}" else null;

  modelModule = {
    freeformType = settingsFormat.type;
    options = {
      tp = mkOption {
        type = types.ints.positive;
        example = 2;
        description = "Tensor parallelism: 1 (one card) or 2 (two cabled cards as one 1x2 mesh).";
      };
      cards = mkOption {
        type = types.listOf (types.either types.ints.unsigned types.str);
        default = [ ];
        example = [
          "0000:01:00.0"
          "0000:02:00.0"
        ];
        description = ''
          The single replica's `tp` cards in rank order: PCI addresses
          (stable across resets) or device indices (resolved when the daemon
          starts). For several replicas use `replicas = [ [ ... ] [ ... ] ]`
          instead.
        '';
      };
      checkpoint = mkOption {
        type = types.coercedTo types.package toString types.str;
        example = "/var/lib/tt-serving/models/SmolLM2-135M-Instruct.Q4_1.gguf";
        description = ''
          What the worker loads (`TT_WORKER_MODEL`): an absolute path on the
          host, given as a string so it is never copied into the Nix store,
          or a package.
        '';
      };
      worker = mkOption {
        type = types.coercedTo types.package (p: [ (lib.getExe p) ]) (types.listOf types.str);
        default = [ "${cfg.package}/bin/tt-worker" ];
        defaultText = literalExpression ''[ "''${config.services.tenstorrent-serving.package}/bin/tt-worker" ]'';
        example = [ "/opt/tt-inference/bin/tt-metal-worker" ];
        description = "The worker command (argv), or a package whose main program is the worker.";
      };
      env_file = mkOption {
        type = types.nullOr types.str;
        default = null;
        example = "/run/secrets/smollm2.env";
        description = ''
          Secrets for this model's workers: a `KEY=VALUE` file outside the
          Nix store, passed with `LoadCredential=` (so setting or moving it
          restarts the service) and read by the daemon at every worker start.
        '';
      };
    };
  };

  renderModel =
    name: m:
    removeAttrs m (lib.optional (m.cards == [ ]) "cards")
    // {
      env_file = credential "model-${name}-env";
    };

  # The typed options' keys first, so that `settings` can override them.
  finalSettings = prune (
    lib.recursiveUpdate {
      daemon = {
        listen =
          if lib.hasInfix ":" cfg.listenAddress then
            "[${cfg.listenAddress}]:${toString cfg.port}"
          else
            "${cfg.listenAddress}:${toString cfg.port}";
        control_socket_group = cfg.controlSocketGroup;
        control_admin_group = cfg.adminGroup;
      };
      inference = {
        tokens_file = credential "tokens";
        tls_cert = credential "tls-cert";
        tls_key = credential "tls-key";
      };
      hardware.tt_smi =
        if cfg.ttSmiPackage != null then lib.getExe' cfg.ttSmiPackage "tt-smi" else null;
    } (lib.recursiveUpdate cfg.settings { models = lib.mapAttrs renderModel cfg.models; })
  );

  renderedToml = settingsFormat.generate "tt-serving-config.toml" finalSettings;

  # Offline: the build sandbox has no cards. This is the module's validator:
  # schema, ranges, TP against cards, a card used twice, environment names.
  configFile =
    if cfg.checkConfig then
      pkgs.runCommand "tt-serving-config.toml" { preferLocalBuild = true; } ''
        ${cfg.package}/bin/tt-servingd check-config --offline ${renderedToml}
        cp ${renderedToml} $out
      ''
    else
      renderedToml;

  d = cfg.settings.daemon;
  stateDirName = managedDir "/var/lib" d.state_dir;
  cacheDirName = managedDir "/var/cache" d.cache_dir;
  socketDir = dirOf d.control_socket;
  runtimeDirName = managedDir "/run" socketDir;
  # Directories systemd does not create for us get a tmpfiles rule.
  unmanagedDirs =
    lib.optional (stateDirName == null) d.state_dir
    ++ lib.optional (cacheDirName == null) d.cache_dir
    ++ lib.optional (runtimeDirName == null) socketDir;

  # tt-umd's warm-reset notification sockets (LISTENER_DIR in tt-umd's
  # device/api/umd/device/warm_reset.hpp); a fixed path in tt-umd.
  umdListenerDir = "/tmp/tt_umd_listeners";

  models = lib.attrValues cfg.models;
  maxOf = default: xs: lib.foldl' lib.max default xs;
  totalCards = lib.foldl' (
    n: m: n + builtins.length m.cards + lib.foldl' (k: r: k + builtins.length r) 0 (m.replicas or [ ])
  ) 0 models;
  # What the models' slots pin together: hugepages_per_card (the daemon's
  # default 4) for each card.
  modelCards = m: builtins.length m.cards + lib.foldl' (k: r: k + builtins.length r) 0 (m.replicas or [ ]);
  hugepagesNeeded = lib.foldl' (n: m: n + modelCards m * (m.hugepages_per_card or 4)) 0 models;

  # The daemon extends the start timeout (EXTEND_TIMEOUT_USEC) while it
  # resets cards and builds caches; the base still covers the longest
  # readiness deadline plus the card resets before it.
  startTimeoutSecs =
    600
    + maxOf daemonDefaults.deadline_secs (
      map (m: m.readiness.deadline_secs or daemonDefaults.deadline_secs) models
    );
  # The daemon's clean-stop budget, Config::stop_limit() in
  # host/src/config/schema.rs (`check-config` prints it; tests/nix/run.sh
  # checks this covers it): the slowest drain, then SIGTERM's grace twice,
  # plus 10 s. A shorter TimeoutStopSec= lets systemd SIGKILL engines in the
  # middle of a clean stop, which wedges their cards. The daemon also sends
  # EXTEND_TIMEOUT_USEC while it stops; the unit does not rely on it.
  stopLimitSecs = maxOf 10 (
    map (
      m:
      (m.drain_timeout_secs or daemonDefaults.drain_timeout_secs)
      + 2 * (m.restart.stop_timeout_secs or daemonDefaults.stop_timeout_secs)
      + 10
    ) models
  );
  stopTimeoutSecs = stopLimitSecs + 20;
  watchdogSecs = lib.max 30 (((d.tick_ms or daemonDefaults.tick_ms) * 10 + 999) / 1000);

  dirOption =
    default: description:
    mkOption {
      type = types.str;
      inherit default description;
    };
in
{
  options.services.tenstorrent-serving = {
    enable = lib.mkEnableOption "tt-serving, the LLM serving daemon for Tenstorrent cards";

    package = lib.mkPackageOption pkgs "tt-serving" { };

    listenAddress = mkOption {
      type = types.str;
      default = "127.0.0.1";
      example = "0.0.0.0";
      description = "Address of the public gRPC port (rendered into `daemon.listen`).";
    };

    port = mkOption {
      type = types.port;
      default = 50051;
      description = "Port of the public gRPC endpoint; 1024 or above (the daemon has no `CAP_NET_BIND_SERVICE`).";
    };

    openFirewall = mkOption {
      type = types.bool;
      default = false;
      description = "Whether to open {option}`port` in the firewall.";
    };

    user = mkOption {
      type = types.str;
      default = "tt-serving";
      description = "User of the daemon and its workers; created when left at the default.";
    };

    group = mkOption {
      type = types.str;
      default = "tt-serving";
      description = "Primary group of {option}`user`; created when left at the default.";
    };

    controlSocketGroup = mkOption {
      type = types.nullOr types.str;
      default = "tenstorrent";
      description = ''
        Group owning the control socket (`daemon.control_socket_group`):
        its members may use `ttctl`'s read-only commands. Created. `null`:
        only the service user and root.
      '';
    };

    adminGroup = mkOption {
      type = types.nullOr types.str;
      default = null;
      example = "tt-admin";
      description = ''
        Group allowed `ttctl`'s destructive commands and the card locks
        (`daemon.control_admin_group`; its members also need
        {option}`controlSocketGroup`). Created. `null`: root only.
      '';
    };

    containerRuntime = mkOption {
      type = types.nullOr (
        types.enum [
          "docker"
          "podman"
        ]
      );
      default = null;
      example = "podman";
      description = ''
        A container runtime for models whose worker runs its engine in a
        container (`tt-worker-openai --container NAME --container-runtime
        docker -- docker run ...`, docs/ENGINES.md "From a container
        image"). The module enables it and lets the unit reach it through
        its API socket: the service's user joins the runtime's socket
        group, the `docker` client is on the unit's PATH, and `DOCKER_HOST`
        names the socket (for podman, its Docker-compatible socket). The
        unit's hardening stays: the client only talks to the socket, and
        the containers are the runtime's children, not the unit's, so the
        worker removes its container on every exit path (kill -9 of the
        daemon included). Joining the socket's group is root-equivalent on
        this host. Running podman inside the unit instead (whose
        `--cgroups=split` keeps the container in the slot's cgroup) needs
        root, user and mount namespaces and the mount system calls, which
        this unit denies (User=, RestrictNamespaces=, SystemCallFilter=
        ~@mount): not offered. `null`: no runtime.
      '';
    };

    environmentFile = mkOption {
      type = types.nullOr types.str;
      default = null;
      example = "/run/secrets/tt-serving.env";
      description = "`EnvironmentFile=` of the daemon (e.g. `RUST_LOG`), outside the Nix store.";
    };

    tokensFile = mkOption {
      type = types.nullOr types.str;
      default = null;
      example = "/run/secrets/tt-serving-tokens";
      description = ''
        Bearer tokens for the public port, one per line, each optionally
        followed by a space and its name (usage is counted per name,
        `ttctl usage`) and by `min_priority=<N>` (the most urgent request
        priority the key may ask; lower is sooner): a file outside the
        Nix store (root-only is fine), passed with `LoadCredential=` and
        rendered as `inference.tokens_file`. Read when the daemon starts.
      '';
    };

    tls = {
      certFile = mkOption {
        type = types.nullOr types.str;
        default = null;
        example = "/var/lib/acme/llm.example.org/fullchain.pem";
        description = "PEM certificate chain for TLS on the public port, outside the store, with {option}`tls.keyFile`.";
      };
      keyFile = mkOption {
        type = types.nullOr types.str;
        default = null;
        example = "/var/lib/acme/llm.example.org/key.pem";
        description = "PEM private key of {option}`tls.certFile`, outside the store.";
      };
    };

    ttSmiPackage = mkOption {
      type = types.nullOr types.package;
      default = pkgs.tt-smi or null;
      defaultText = literalExpression "pkgs.tt-smi or null";
      description = "The `tt-smi` used for resets (`hardware.tt_smi`). `null`: from the service's `PATH`.";
    };

    checkConfig = mkOption {
      type = types.bool;
      default = true;
      description = ''
        Check the rendered file with `tt-servingd check-config --offline`
        when the system is built, so a bad config fails `nixos-rebuild`.
        Turn off when cross-compiling.
      '';
    };

    hugepages = {
      enable = mkOption {
        type = types.bool;
        default = true;
        description = "Whether to reserve and mount 1 GiB hugepages for the engines' pinned host buffers.";
      };
      count = mkOption {
        type = types.ints.positive;
        # The vendor's host setup reserves 4 x 1 GiB pages per card
        # (tenstorrent/tt-system-tools, hugepages-setup.sh), and tt-metal
        # pins its host buffers from /dev/hugepages-1G: one page per card is
        # the bare minimum (the warning below), not what engines are tuned for.
        default = lib.max 4 hugepagesNeeded;
        defaultText = literalExpression "what the models' slots need (each model's hugepages_per_card, 4 by default, for each card), at least 4";
        description = ''
          1 GiB pages to reserve (kernel command line, and topped up at
          runtime when memory allows). The default is what the models'
          slots need together: each model's `hugepages_per_card` (4 by
          default, as Tenstorrent's `hugepages-setup.sh` reserves) for each
          of its cards, at least 4. The daemon refuses slots that need more
          than the host reserved (`check-config` at build time, and every
          start); fewer than one per card draws a warning.
        '';
      };
      mountPoint = mkOption {
        type = types.str;
        default = "/dev/hugepages-1G";
        description = "Where the `hugetlbfs` with `pagesize=1G` is mounted (tt-metal looks here).";
      };
    };

    models = mkOption {
      type = types.attrsOf (types.submodule modelModule);
      default = { };
      example = literalExpression ''
        {
          smollm2 = {
            tp = 1;
            cards = [ "0000:01:00.0" ];
            checkpoint = "/var/lib/tt-serving/models/SmolLM2-135M-Instruct.Q4_1.gguf";
            readiness.expect = "Paris";
          };
        }
      '';
      description = ''
        The models to serve, by name: each is the config file's
        `[models.<name>]` table in its own keys (`flags`, `cache_flags`,
        `env`, `readiness.deadline_secs`, `restart.stop_timeout_secs`, ...).
      '';
    };

    settings = mkOption {
      default = { };
      example = literalExpression ''
        {
          daemon.log_format = "json";
          reset.policy = "always";
        }
      '';
      description = ''
        The rest of the daemon's config (`/etc/tt-serving/config.toml`) in
        the file's own keys; `null` values are left out, so the daemon's
        defaults apply.
      '';
      type = types.submodule {
        freeformType = settingsFormat.type;
        options.daemon = {
          control_socket = dirOption "/run/tt-serving/control.sock" "The control socket `ttctl` uses.";
          state_dir = dirOption "/var/lib/tt-serving" "Persistent state (clean-shutdown record).";
          cache_dir = dirOption "/var/cache/tt-serving" "Root of the tensor caches.";
          lock_dir = dirOption "/run/lock/tenstorrent" "One lock file per card (tmpfiles).";
        };
      };
    };

    finalSettings = mkOption {
      type = types.attrsOf types.anything;
      readOnly = true;
      internal = true;
      description = "The settings as rendered into the config file.";
    };
  };

  config = mkIf cfg.enable (mkMerge [
    {
      services.tenstorrent-serving.finalSettings = finalSettings;

      assertions = [
        {
          assertion = cfg.port >= 1024;
          message = "services.tenstorrent-serving.port = ${toString cfg.port} is ${
            if cfg.port == 0 then "not a fixed port" else "a privileged port"
          }; the daemon runs as ${cfg.user} without CAP_NET_BIND_SERVICE. Use a port from 1024 to 65535 (the default is 50051), or put a proxy in front.";
        }
        {
          # ProtectProc=, ProcSubset= and LoadCredential= (the secrets) came
          # in systemd 247; an older systemd ignores them with a warning and
          # the daemon would start without its hardening or its tokens.
          assertion =
            !(config.systemd.package ? version) || lib.versionAtLeast config.systemd.package.version "247";
          message = "services.tenstorrent-serving needs systemd 247 or later (this system has ${
            config.systemd.package.version or "?"
          }): the unit's ProtectProc=, ProcSubset= and LoadCredential= would be ignored. Use a NixOS release with systemd 247 or newer.";
        }
        {
          assertion = (cfg.tls.certFile == null) == (cfg.tls.keyFile == null);
          message = "services.tenstorrent-serving.tls: set both certFile and keyFile for TLS on the public port, or neither for plaintext.";
        }
      ]
      ++ lib.mapAttrsToList (_: s: {
        assertion = lib.hasPrefix "/" s.path && !(lib.hasPrefix "${builtins.storeDir}/" s.path);
        message =
          if !(lib.hasPrefix "/" s.path) then
            "services.tenstorrent-serving.${s.option} = \"${s.path}\" is not an absolute path; give the file's full path, e.g. \"/run/secrets/tt-serving-tokens\"."
          else
            "services.tenstorrent-serving.${s.option} = \"${s.path}\" is in the Nix store, which every local user can read; keep the file outside the store (e.g. /run/secrets/..., written by agenix or sops-nix) and give its path as a string.";
      }) secrets;

      warnings =
        lib.optional
          (
            cfg.openFirewall
            && builtins.elem cfg.listenAddress [
              "127.0.0.1"
              "::1"
              "localhost"
            ]
          )
          "services.tenstorrent-serving.openFirewall opens port ${toString cfg.port}, but the daemon listens on ${cfg.listenAddress} only; set listenAddress = \"0.0.0.0\" to serve other hosts."
        ++ lib.optional (cfg.hugepages.enable && cfg.hugepages.count < totalCards)
          "services.tenstorrent-serving.hugepages.count = ${toString cfg.hugepages.count} is below the ${toString totalCards} cards the models use; tt-metal pins at least one 1 GiB hugepage per card, and Tenstorrent's host setup (hugepages-setup.sh) reserves 4 per card. Raise hugepages.count to at least ${toString totalCards}, or remove it for the default of ${toString (4 * totalCards)}.";

      environment.etc."tt-serving/config.toml".source = configFile;

      # ttctl (and tt-servingd check-config) for operators.
      environment.systemPackages = [ cfg.package ];
      environment.variables = lib.optionalAttrs (d.control_socket != "/run/tt-serving/control.sock") {
        TTCTL_SOCKET = d.control_socket;
      };

      users.users = lib.optionalAttrs (cfg.user == "tt-serving") {
        tt-serving = {
          isSystemUser = true;
          group = cfg.group;
          home = d.state_dir;
          description = "tt-serving daemon";
        };
      };
      users.groups =
        lib.optionalAttrs (cfg.group == "tt-serving") { tt-serving = { }; }
        // lib.optionalAttrs (cfg.controlSocketGroup != null) { ${cfg.controlSocketGroup} = { }; }
        // lib.optionalAttrs (cfg.adminGroup != null) { ${cfg.adminGroup} = { }; };

      # The lock dir outlives the daemon (scripts and `ttctl card borrow`
      # take the same locks), so tmpfiles owns it rather than
      # RuntimeDirectory=. Only the admin group may take card locks (the
      # daemon refuses a lock dir other users can write into); setgid: lock
      # files inherit the admin group.
      systemd.tmpfiles.rules = [
        (
          if cfg.adminGroup != null then
            "d ${d.lock_dir} 2775 ${cfg.user} ${cfg.adminGroup} - -"
          else
            "d ${d.lock_dir} 0755 ${cfg.user} ${cfg.group} - -"
        )
      ]
      ++ map (dir: "d ${dir} 0750 ${cfg.user} ${cfg.group} - -") unmanagedDirs
      # tt-umd's warm-reset listeners (see BindPaths= below): one host
      # directory for every process that opens a card. 1777 like /tmp
      # itself: every user's tt-umd (the engines as the service's user, an
      # operator's tt-smi, a benchmark) creates its own client_<PID>.sock
      # there, and the sticky bit keeps one user from removing or replacing
      # another's socket. Owned by root, so tt-umd's own chmod of it
      # (perms::all, no sticky bit; device/warm_reset.cpp) fails harmlessly
      # unless root runs it (then the sticky bit is gone until tmpfiles next
      # runs). Age "-": never cleaned, and its own line keeps /tmp's aging
      # off it.
      ++ [ "d ${umdListenerDir} 1777 root root - -" ];

      networking.firewall.allowedTCPPorts = lib.optional cfg.openFirewall cfg.port;

      virtualisation = lib.optionalAttrs (cfg.containerRuntime == "docker") {
        docker.enable = true;
      }
      // lib.optionalAttrs (cfg.containerRuntime == "podman") {
        podman.enable = true;
        # /run/docker.sock, served by podman, owned by group podman.
        podman.dockerSocket.enable = true;
      };

      systemd.services.tenstorrent-serving = {
        description = "tt-serving: language models on Tenstorrent cards";
        wantedBy = [ "multi-user.target" ];
        after = [
          "network.target"
          "systemd-tmpfiles-setup.service"
        ]
        ++ lib.optional cfg.hugepages.enable "tenstorrent-hugepages.service";
        wants = lib.optional cfg.hugepages.enable "tenstorrent-hugepages.service";
        # A switch that changes only models reloads the daemon (ExecReload=
        # `ttctl reload`, which waits for the outcome): unchanged slots keep serving, changed ones
        # restart, removed ones stop, added ones start. Every other section
        # (daemon, hardware, reset, inference, limits, ...) restarts it
        # instead. See docs/nixos.md.
        reloadTriggers = [ configFile ];
        restartTriggers = [
          (builtins.hashString "sha256" (builtins.toJSON (removeAttrs finalSettings [ "models" ])))
        ];
        environment = {
          HOME = d.state_dir;
        }
        // lib.optionalAttrs (cfg.containerRuntime != null) {
          DOCKER_HOST = "unix:///run/docker.sock";
        };
        # The docker client talks to either runtime's socket.
        path = lib.optional (cfg.containerRuntime != null) pkgs.docker-client;
        unitConfig.RequiresMountsFor = lib.optional cfg.hugepages.enable cfg.hugepages.mountPoint;
        serviceConfig = {
          # Type=notify, not notify-reload: systemd 252 does not know
          # notify-reload (the unit then ran as Type=simple, seen in a
          # guest), and a notify-reload service cannot fail a reload: a
          # refused config still gave `systemctl reload` exit 0. Instead
          # ExecReload= asks the daemon over the control socket and waits
          # for its report: `ttctl reload` exits 1 when the daemon refuses
          # the file or a changed slot does not come up, and so
          # `systemctl reload` (and `nixos-rebuild switch`) fail. "+": run
          # as root, whom the control socket admits for a reload (the
          # service's own user is not an admin). TimeoutStartSec= bounds it.
          Type = "notify";
          NotifyAccess = "main";
          ExecStart = "${cfg.package}/bin/tt-servingd run --config /etc/tt-serving/config.toml";
          ExecReload = "+${cfg.package}/bin/ttctl --socket ${d.control_socket} reload";
          User = cfg.user;
          Group = cfg.group;
          # Membership lets the daemon hand the control socket to the group.
          # The admin group: lock files are given to it (mode 0660).
          SupplementaryGroups =
            lib.optional (cfg.controlSocketGroup != null) cfg.controlSocketGroup
            ++ lib.optional (cfg.adminGroup != null) cfg.adminGroup
            # The runtime's API socket (/run/docker.sock) is group-owned.
            ++ lib.optional (cfg.containerRuntime != null) cfg.containerRuntime;
          EnvironmentFile = lib.optional (cfg.environmentFile != null) cfg.environmentFile;
          # Tokens, certificate, key and the models' env files, rendered as
          # paths under /run/credentials/tenstorrent-serving.service/ (mode
          # 0400, the service's user).
          LoadCredential = lib.mapAttrsToList (id: s: "${id}:${s.path}") secrets;

          # The daemon pings the watchdog every tick and extends the start
          # timeout (EXTEND_TIMEOUT_USEC) while it resets cards and builds
          # caches; a cold build of a large model takes many minutes.
          WatchdogSec = "${toString watchdogSecs}s";
          TimeoutStartSec = "${toString startTimeoutSecs}s";
          TimeoutStopSec = "${toString stopTimeoutSecs}s";
          Restart = "on-failure";
          RestartSec = "10s";
          # Only the daemon gets SIGTERM: it drains its slots and stops the
          # workers itself. Killing a live engine directly wedges its cards.
          KillMode = "mixed";
          # Said, not left to the default (with Delegate=yes systemd's is
          # `continue`): a kernel OOM kill inside a slot's cgroup is the
          # daemon's to handle (it reports the evidence and restarts the
          # slot); it must not stop the unit and every other slot with it.
          OOMPolicy = "continue";
          # The daemon puts each slot's worker, and everything the engine
          # starts (children that leave its process group included), in a
          # cgroup of its own below the unit's: a slot is killed whole
          # (cgroup.kill), its memory is counted whole, an OOM kill in it
          # is known from memory.events, and models.<name>.memory_max_mib
          # becomes memory.max. The daemon moves itself into <unit>/daemon
          # first (cgroup v2 lets only leaves hold processes once the
          # memory controller is handed down). Without this it falls back
          # to walking the process tree, and `ttctl status` says so.
          Delegate = "yes";

          StateDirectory = lib.optional (stateDirName != null) stateDirName;
          StateDirectoryMode = "0750";
          CacheDirectory = lib.optional (cacheDirName != null) cacheDirName;
          CacheDirectoryMode = "0750";
          # The control socket's directory; the socket itself is 0660 and
          # owned by controlSocketGroup, so the directory stays traversable.
          RuntimeDirectory = lib.optional (runtimeDirName != null) runtimeDirName;
          RuntimeDirectoryMode = "0755";
          ReadWritePaths = [ d.lock_dir ]
          ++ unmanagedDirs
          # "-": the mount may be missing; the engine then says so itself.
          ++ lib.optional cfg.hugepages.enable "-${cfg.hugepages.mountPoint}";
          WorkingDirectory = d.state_dir;
          UMask = "0027";

          # Pinned host buffers (hugepages, DMA) are locked memory.
          LimitMEMLOCK = "infinity";
          LimitNOFILE = 65536;

          # Devices: only the Tenstorrent character devices.
          DeviceAllow = [ "char-tenstorrent rw" ];
          DevicePolicy = "closed";
          # PrivateDevices= would hide /dev/tenstorrent and /dev/hugepages-1G.
          PrivateDevices = false;

          # Hardening, tuned so the engine still runs.
          CapabilityBoundingSet = [ "" ];
          NoNewPrivileges = true;
          ProtectSystem = "strict";
          ProtectHome = true;
          PrivateTmp = true;
          # ...except tt-umd's warm-reset listener directory, the host's
          # (created by the tmpfiles rule above): tt-umd announces a reset to
          # every unix socket in /tmp/tt_umd_listeners (client_<PID>.sock;
          # LISTENER_DIR in device/api/umd/device/warm_reset.hpp), before
          # and after it, so open devices can quiesce and reopen. In the
          # unit's private /tmp the engines' listeners would miss a
          # `tt-smi -r` run outside the unit (an operator, a benchmark) and
          # never hear other processes' resets. The bind is mounted on top
          # of the private /tmp and stays writable under ProtectSystem=.
          BindPaths = [ umdListenerDir ];
          ProtectClock = true;
          # Not `true`: that mounts /sys/fs/cgroup read-only, delegated
          # subtree included. systemd 257 and later: "private", a cgroup
          # namespace whose root is the unit's cgroup, writable; before,
          # the delegation alone (the unit's cgroup given to the service's
          # user, every other cgroup file root's) bounds what it may write.
          ProtectControlGroups =
            if lib.versionAtLeast (config.systemd.package.version or "0") "257" then "private" else false;
          ProtectHostname = true;
          ProtectKernelLogs = true;
          ProtectKernelModules = true;
          # sysfs is only read (card attributes, heartbeats, hwmon); tt-smi
          # resets Blackhole cards through the driver's ioctls.
          ProtectKernelTunables = true;
          # Not "invisible": `ttctl status` names foreign processes holding a
          # card (from /proc/locks and /proc/driver/tenstorrent/N/pids).
          ProtectProc = "default";
          ProcSubset = "all";
          # PrivateUsers= would unmap controlSocketGroup (and the device
          # nodes' owners) inside the service.
          PrivateUsers = false;
          # /dev/shm stays shared: tt-umd's per-chip locks live there
          # (TT_UMD_LOCK.CHIP_IN_USE_<n>_PCIe and friends, robust pthread
          # mutexes; tenstorrent/tt-umd device/utils/lock_manager.cpp) and
          # must be seen by other processes.
          PrivateIPC = false;
          # Not `true`: RemoveIPC= deletes the POSIX shared memory (files in
          # /dev/shm) owned by the service's user when the unit stops, and
          # so the TT_UMD_LOCK.* files the engines created (seen under real
          # systemd: a TT_UMD_LOCK.CHIP_IN_USE_* file gone after the stop).
          # tt-umd's robust_mutex.hpp: "the implementation relies on the
          # client not deleting underlying /dev/shm files": a process that
          # still has the deleted file mapped (tt-smi, a benchmark) and one
          # that creates a fresh file no longer exclude each other.
          RemoveIPC = false;
          RestrictAddressFamilies = [
            "AF_UNIX"
            "AF_INET"
            "AF_INET6"
          ];
          RestrictNamespaces = true;
          RestrictRealtime = true;
          RestrictSUIDSGID = true;
          LockPersonality = true;
          SystemCallArchitectures = "native";
          # @chown stays allowed (it is part of @privileged): the daemon hands
          # the control socket to controlSocketGroup. @resources covers NUMA
          # placement (mbind, set_mempolicy) of the engine's buffers.
          SystemCallFilter = [
            "@system-service"
            "@resources"
            "~@clock @cpu-emulation @debug @module @mount @obsolete @raw-io @reboot @swap"
          ];
          SystemCallErrorNumber = "EPERM";
          # No MemoryDenyWriteExecute=: engines JIT-compile. tt-metal builds
          # device kernels at run time and host libraries under it (PyTorch's
          # oneDNN, for one) map writable+executable pages for generated x86
          # code; MemoryDenyWriteExecute=true kills such a worker on its first
          # request.
          MemoryDenyWriteExecute = false;
        };
      };
    }

    (mkIf cfg.hugepages.enable {
      # Reliable: reserved at boot, before memory fragments.
      boot.kernelParams = [
        "hugepagesz=1G"
        "hugepages=${toString cfg.hugepages.count}"
      ];

      # Best effort without a reboot (right after `nixos-rebuild switch`).
      systemd.services.tenstorrent-hugepages = {
        description = "Reserve 1 GiB hugepages for Tenstorrent engines";
        before = [ "tenstorrent-serving.service" ];
        unitConfig.ConditionPathExists = "/sys/kernel/mm/hugepages/hugepages-1048576kB/nr_hugepages";
        serviceConfig = {
          Type = "oneshot";
          RemainAfterExit = true;
        };
        script = ''
          f=/sys/kernel/mm/hugepages/hugepages-1048576kB/nr_hugepages
          want=${toString cfg.hugepages.count}
          if [ "$(cat "$f")" -lt "$want" ]; then
            echo "$want" > "$f" || true
          fi
          got=$(cat "$f")
          if [ "$got" -lt "$want" ]; then
            echo "only $got of $want 1 GiB hugepages could be reserved; they will be after a reboot (hugepages=$want is on the kernel command line)" >&2
          fi
        '';
      };

      systemd.mounts = [
        {
          description = "1 GiB hugepages for Tenstorrent engines";
          what = "hugetlbfs";
          where = cfg.hugepages.mountPoint;
          type = "hugetlbfs";
          # Like /dev/shm: every user may map pages, the sticky bit keeps
          # users from removing each other's files. Benchmarks borrowing a
          # card need the same mount.
          options = "pagesize=1G,mode=1777,nosuid,nodev";
          after = [ "tenstorrent-hugepages.service" ];
          wants = [ "tenstorrent-hugepages.service" ];
          wantedBy = [ "multi-user.target" ];
        }
      ];
    })

    # Kernel driver, udev rule and tt-smi, where this nixpkgs has the module.
    (lib.optionalAttrs (options ? hardware.tenstorrent.enable) {
      hardware.tenstorrent.enable = mkDefault true;
    })
  ]);
}
