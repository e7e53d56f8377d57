# NixOS module for tt-serving: `services.tenstorrent-serving`.
#
# Renders the daemon's TOML config (see `tt-servingd print-example-config`)
# from typed options plus free-form `settings` (RFC 0042), and runs
# `tt-servingd` as a hardened systemd service that owns the host's
# Tenstorrent cards. Documentation: docs/nixos.md.
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

  # The daemon sets these for every worker; a model may not set them.
  reservedEnv = [
    "TT_VISIBLE_DEVICES"
    "MESH_DEVICE"
    "TT_WORKER_SOCKET"
    "TT_WORKER_MODEL"
    "TT_WORKER_TP"
    "TT_CACHE_DIR"
    "TT_CACHE_MODE"
  ];

  # Daemon defaults the module needs for its own arithmetic (unit timeouts).
  # They mirror daemon/src/config/schema.rs; the rendered file omits every
  # option left at null, so the daemon's own defaults apply there.
  daemonDefaults = {
    tickMs = 1000;
    deadlineSecs = 1800;
    drainTimeoutSecs = 30;
    stopTimeoutSecs = 20;
  };

  # ---------------------------------------------------------------- helpers

  orDefault = default: v: if v == null then default else v;

  # Drop nulls ("omit, use the daemon's default") and the tables they leave
  # empty, recursively; lists are kept as given.
  prune =
    v:
    if builtins.isAttrs v && !lib.isDerivation v then
      lib.filterAttrs (_: x: x != null && x != { }) (lib.mapAttrs (_: prune) v)
    else if builtins.isList v then
      map prune v
    else
      v;

  # Environment values: strings, with booleans and integers accepted for
  # convenience (true -> "1", false -> "0").
  envValue = types.coercedTo (types.either types.bool types.int) (
    v:
    if builtins.isBool v then
      (if v then "1" else "0")
    else
      toString v
  ) types.str;

  cardRef = types.either types.ints.unsigned types.str;

  # A card as the daemon compares them: BDFs lower-cased with the PCI domain
  # added, indices as "index N" (an index and a BDF naming the same card can
  # only be matched on the host, by the daemon).
  cardId =
    c:
    if builtins.isInt c then
      "index ${toString c}"
    else
      let
        s = lib.toLower c;
      in
      if builtins.length (lib.splitString ":" s) == 2 then "0000:${s}" else s;

  showCards = cards: "[ ${lib.concatMapStringsSep " " (c: builtins.toJSON c) cards} ]";

  # A directory systemd can manage for us (StateDirectory= and friends) when
  # it lies under `base`; null otherwise.
  managedDir =
    base: path:
    let
      p = toString path;
    in
    if lib.hasPrefix "${base}/" p && p != "${base}/" then lib.removePrefix "${base}/" p else null;

  isAbsolute = p: lib.hasPrefix "/" (toString p);

  # ----------------------------------------------------------- model option

  modelModule =
    { name, ... }:
    {
      options = {
        tp = mkOption {
          type = types.enum [
            1
            2
          ];
          example = 2;
          description = ''
            Tensor parallelism: 1 (one card) or 2 (two cabled cards as one
            1x2 mesh). Each replica needs exactly `tp` cards.
          '';
        };

        cards = mkOption {
          type = types.listOf cardRef;
          default = [ ];
          example = [
            "0000:01:00.0"
            "0000:02:00.0"
          ];
          description = ''
            The cards of this model's single replica, in rank order: PCI
            addresses (`"0000:01:00.0"`, stable across resets) or device
            indices (`0`, resolved to a PCI address when the daemon starts).
            Use {option}`replicas` instead to run several replicas.
          '';
        };

        replicas = mkOption {
          type = types.listOf (types.listOf cardRef);
          default = [ ];
          example = [
            [ "0000:03:00.0" ]
            [ "0000:04:00.0" ]
          ];
          description = ''
            Several replicas of the model, each a list of `tp` cards. Each
            replica is its own slot (`<model>/0`, `<model>/1`, ...). Exclusive
            with {option}`cards`.
          '';
        };

        checkpoint = mkOption {
          type = types.coercedTo types.package (p: "${p}") types.str;
          example = "/var/lib/tt-serving/models/SmolLM2-135M-Instruct.Q4_1.gguf";
          description = ''
            The checkpoint the worker loads (passed as `TT_WORKER_MODEL`): an
            absolute path on the host, or a package (its store path). A plain
            string is never copied into the Nix store, which matters for a
            50 GB checkpoint.
          '';
        };

        worker = mkOption {
          type = types.coercedTo types.package (p: [ (lib.getExe p) ]) (types.listOf types.str);
          default = [ "${cfg.package}/bin/tt-worker" ];
          defaultText = literalExpression ''[ "''${config.services.tenstorrent-serving.package}/bin/tt-worker" ]'';
          example = literalExpression ''[ "/opt/tt-metal/bin/engine-worker" "--max-batch" "8" ]'';
          description = ''
            The worker command (argv), or a package whose main program is the
            worker. The default is the project's reference engine `tt-worker`.
            The daemon passes everything else through the environment
            (`TT_VISIBLE_DEVICES`, `MESH_DEVICE`, `TT_WORKER_SOCKET`, ...).
          '';
        };

        meshDevice = mkOption {
          type = types.nullOr types.str;
          default = null;
          example = "P300";
          description = ''
            `MESH_DEVICE` for the worker. `null`: the daemon's default, `P150`
            for TP=1 and `P300` for TP=2.
          '';
        };

        flags = mkOption {
          type = types.attrsOf envValue;
          default = { };
          example = {
            QWEN36_SDPA_STREAMING = "1";
            TTW_KV_F16 = true;
          };
          description = ''
            The engine's feature flags, passed to the worker as environment
            variables. Booleans render as `"1"`/`"0"`. With the default banner
            rule, every flag set to a truthy value must print `<FLAG> engaged`
            by the end of the readiness ping, or the slot is not ready.
          '';
        };

        cacheFlags = mkOption {
          type = types.listOf types.str;
          default = [ ];
          example = [ "TTW_MLP_DOWN_Q8" ];
          description = ''
            Names of flags that change the tensor cache files. Changing one of
            them selects a new cache variant, built cold exactly once.
          '';
        };

        extraEnvironment = mkOption {
          type = types.attrsOf envValue;
          default = { };
          example = {
            TT_METAL_LOGGER_LEVEL = "WARNING";
          };
          description = ''
            Extra environment for every start of this model's workers
            (rendered as `env`). Workers do not inherit the daemon's
            environment beyond `PATH`, `HOME`, `LANG`, `LC_ALL`, `TZ` and
            `RUST_LOG`.
          '';
        };

        coldEnvironment = mkOption {
          type = types.attrsOf envValue;
          default = { };
          example = {
            TT_TRANSFORMERS_FORCE_MODEL_LOAD = "1";
          };
          description = ''
            Extra environment for cold starts only, when the tensor cache is
            built (rendered as `cold_env`). tt-metal engines need
            `TT_TRANSFORMERS_FORCE_MODEL_LOAD = "1"` here.
          '';
        };

        warmEnvironment = mkOption {
          type = types.attrsOf envValue;
          default = { };
          description = ''
            Extra environment for warm starts only, from an existing cache
            (rendered as `warm_env`).
          '';
        };

        environmentFile = mkOption {
          type = types.nullOr types.str;
          default = null;
          example = "/run/secrets/smollm2.env";
          description = ''
            Secrets for this model's workers (API keys, licence tokens): a
            file of `KEY=VALUE` lines (`#` comments, optional `export` and
            quotes). Give a path as a string, outside the Nix store; it is
            passed to the daemon with `LoadCredential=` (rendered as
            `env_file`), and the daemon reads it at every worker start.
            systemd copies credentials when the service starts, so setting
            this option restarts the service, and a rotated file reaches the
            workers after `systemctl restart tenstorrent-serving`. Its values
            never appear in the config, the logs, `ttctl status` or reload
            plans. Its variables override {option}`extraEnvironment`; flags
            and the daemon's own variables override them.
          '';
        };

        banners = {
          patterns = mkOption {
            type = types.listOf types.str;
            default = [ ];
            example = [ "QWEN*" ];
            description = ''
              Flags covered by the fail-closed banner rule, as glob patterns
              over flag names (`*` matches any run of characters). Empty
              covers every flag.
            '';
          };
          mode = mkOption {
            type = types.nullOr (
              types.enum [
                "truthy"
                "both"
                "off"
              ]
            );
            default = null;
            example = "both";
            description = ''
              `truthy`: every covered flag set to a truthy value must print
              `<FLAG> engaged`. `both`: also, no covered flag set to a falsy
              value may print it (A/B control arms). `off`: no check. `null`:
              the daemon's default, `truthy`.
            '';
          };
        };

        readiness = {
          deadlineSecs = mkOption {
            type = types.nullOr types.ints.positive;
            default = null;
            example = 3600;
            description = ''
              Seconds from worker start to Ready; a cold build of a large
              model takes many minutes. `null`: the daemon's default, 1800.
              The unit's start timeout is derived from the largest deadline.
            '';
          };
          pingPrompt = mkOption {
            type = types.nullOr types.str;
            default = null;
            example = "The capital of France is";
            description = ''
              Prompt of the readiness ping. `null`: the daemon's default,
              "The capital of France is".
            '';
          };
          pingMaxTokens = mkOption {
            type = types.nullOr types.ints.positive;
            default = null;
            example = 8;
            description = "Tokens generated greedily by the readiness ping. `null`: the daemon's default, 4.";
          };
          expect = mkOption {
            type = types.nullOr types.str;
            default = null;
            example = "Paris";
            description = ''
              Text the readiness ping's answer must contain. `null`: any
              answer is accepted.
            '';
          };
        };

        restart = {
          maxAttempts = mkOption {
            type = types.nullOr types.ints.positive;
            default = null;
            description = ''
              Restarts within {option}`windowSecs` before the slot stays Failed
              until `ttctl slot restart`. `null`: the daemon's default, 5.
            '';
          };
          windowSecs = mkOption {
            type = types.nullOr types.ints.positive;
            default = null;
            description = "Window for counting restarts, in seconds. `null`: the daemon's default, 600.";
          };
          backoffMs = mkOption {
            type = types.nullOr types.ints.positive;
            default = null;
            description = "First restart backoff in milliseconds, doubling per attempt. `null`: the daemon's default, 1000.";
          };
          backoffMaxMs = mkOption {
            type = types.nullOr types.ints.positive;
            default = null;
            description = "Longest restart backoff in milliseconds. `null`: the daemon's default, 60000.";
          };
          stallTimeoutSecs = mkOption {
            type = types.nullOr types.ints.positive;
            default = null;
            description = ''
              With requests active and no decode progress for this long, the
              worker is declared hung and restarted. `null`: the daemon's
              default, 120.
            '';
          };
          rssLimitMiB = mkOption {
            type = types.nullOr types.ints.positive;
            default = null;
            example = 65536;
            description = ''
              Worker resident memory limit in MiB; above it the worker is
              drained and restarted before the kernel's OOM killer acts.
              `null`: no limit.
            '';
          };
          stopTimeoutSecs = mkOption {
            type = types.nullOr types.ints.positive;
            default = null;
            description = ''
              Grace period between SIGTERM and SIGKILL when a worker stops, in
              seconds. `null`: the daemon's default, 20.
            '';
          };
        };

        maxQueue = mkOption {
          type = types.nullOr types.ints.positive;
          default = null;
          description = ''
            Requests waiting for this model beyond this get
            `RESOURCE_EXHAUSTED`. `null`: the daemon's default, 64.
          '';
        };

        recoveryWaitSecs = mkOption {
          type = types.nullOr types.ints.unsigned;
          default = null;
          example = 0;
          description = ''
            With no slot of this model Ready but one recovering (restarting
            after a crash or kill), how long a request may wait for it in
            the queue, in seconds; never past the request's own deadline.
            `0`: answer `UNAVAILABLE` at once, with a retry hint (for
            engines whose recovery takes minutes). `null`: the daemon's
            default, 30.
          '';
        };

        rollbackOnFailure = mkOption {
          type = types.bool;
          default = false;
          description = ''
            On reload (a `nixos-rebuild switch` that changes this model):
            when the changed definition fails to come up, bring the previous
            definition back instead of leaving the slot Failed.
          '';
        };

        drainTimeoutSecs = mkOption {
          type = types.nullOr types.ints.positive;
          default = null;
          description = ''
            How long in-flight requests may run when a slot drains, in
            seconds. `null`: the daemon's default, 30.
          '';
        };

        settings = mkOption {
          type = types.submodule { freeformType = settingsFormat.type; };
          default = { };
          example = {
            mesh_device = "P300";
          };
          description = ''
            Extra keys for this model's `[models.${name}]` table, rendered
            verbatim (snake_case, as in `tt-servingd print-example-config`)
            on top of the typed options above.
          '';
        };
      };
    };

  # -------------------------------------------------------------- rendering

  renderModel =
    name: m:
    lib.recursiveUpdate (
      {
        inherit (m) tp checkpoint worker;
        mesh_device = m.meshDevice;
        flags = m.flags;
        cache_flags = if m.cacheFlags == [ ] then null else m.cacheFlags;
        env = m.extraEnvironment;
        cold_env = m.coldEnvironment;
        warm_env = m.warmEnvironment;
        env_file = if m.environmentFile != null then "${credentialsDir}/${modelCredential name}" else null;
        banners = {
          patterns = if m.banners.patterns == [ ] then null else m.banners.patterns;
          inherit (m.banners) mode;
        };
        readiness = {
          deadline_secs = m.readiness.deadlineSecs;
          ping_prompt = m.readiness.pingPrompt;
          ping_max_tokens = m.readiness.pingMaxTokens;
          inherit (m.readiness) expect;
        };
        restart = {
          max_attempts = m.restart.maxAttempts;
          window_secs = m.restart.windowSecs;
          backoff_ms = m.restart.backoffMs;
          backoff_max_ms = m.restart.backoffMaxMs;
          stall_timeout_secs = m.restart.stallTimeoutSecs;
          rss_limit_mib = m.restart.rssLimitMiB;
          stop_timeout_secs = m.restart.stopTimeoutSecs;
        };
        max_queue = m.maxQueue;
        recovery_wait_secs = m.recoveryWaitSecs;
        drain_timeout_secs = m.drainTimeoutSecs;
        rollback_on_failure = if m.rollbackOnFailure then true else null;
      }
      // lib.optionalAttrs (m.cards != [ ]) { inherit (m) cards; }
      // lib.optionalAttrs (m.replicas != [ ]) { inherit (m) replicas; }
    ) m.settings;

  finalSettings = prune (
    lib.recursiveUpdate cfg.settings { models = lib.mapAttrs renderModel cfg.models; }
  );

  # Nulls and empty tables are pruned (as are empty lists the daemon reads
  # the same as a missing key), so a lean config renders to a lean file.
  renderedToml = settingsFormat.generate "tt-serving-config.toml" finalSettings;

  # Offline: the build sandbox has no cards; this checks the schema, ranges
  # and cross-field rules (TP vs cards, a card used twice, ...).
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
  socketDir = dirOf (toString d.control_socket);
  runtimeDirName = managedDir "/run" socketDir;

  # Directories systemd does not create for us get a tmpfiles rule.
  unmanagedDirs =
    lib.optional (stateDirName == null) d.state_dir
    ++ lib.optional (cacheDirName == null) d.cache_dir
    ++ lib.optional (runtimeDirName == null) socketDir;

  # Secrets reach the daemon through LoadCredential=: systemd copies each
  # file (readable by root alone, if it likes) into a directory only the
  # service's user can read, whatever ProtectHome=/ProtectSystem= hide.
  credentialsDir = "/run/credentials/tenstorrent-serving.service";
  modelCredential = name: "model-${name}-env";
  modelsWithEnvFile = lib.filterAttrs (_: m: m.environmentFile != null) cfg.models;
  credentials =
    lib.optional (cfg.tokensFile != null) "tokens:${cfg.tokensFile}"
    ++ lib.optional (cfg.tls.certFile != null) "tls-cert:${cfg.tls.certFile}"
    ++ lib.optional (cfg.tls.keyFile != null) "tls-key:${cfg.tls.keyFile}"
    ++ lib.mapAttrsToList (
      name: m: "${modelCredential name}:${m.environmentFile}"
    ) modelsWithEnvFile;
  secretFiles =
    lib.filterAttrs (_: v: v != null) {
      tokensFile = cfg.tokensFile;
      "tls.certFile" = cfg.tls.certFile;
      "tls.keyFile" = cfg.tls.keyFile;
    }
    // lib.mapAttrs' (
      name: m: lib.nameValuePair "models.${name}.environmentFile" m.environmentFile
    ) modelsWithEnvFile;

  models = lib.attrValues cfg.models;
  maxOf = default: xs: lib.foldl' lib.max default xs;

  # The daemon extends the start timeout (EXTEND_TIMEOUT_USEC) while it
  # resets cards and builds caches; the base still has to cover the longest
  # readiness deadline plus the card resets before it.
  startTimeoutSecs =
    600 + maxOf daemonDefaults.deadlineSecs (
      map (m: orDefault daemonDefaults.deadlineSecs m.readiness.deadlineSecs) models
    );
  # Stopping drains every slot, then stops workers with SIGTERM and SIGKILL.
  stopTimeoutSecs =
    30
    + maxOf (daemonDefaults.drainTimeoutSecs + daemonDefaults.stopTimeoutSecs) (
      map (
        m:
        orDefault daemonDefaults.drainTimeoutSecs m.drainTimeoutSecs
        + orDefault daemonDefaults.stopTimeoutSecs m.restart.stopTimeoutSecs
      ) models
    );
  tickMs = orDefault daemonDefaults.tickMs (d.tick_ms or null);
  watchdogSecs = lib.max 30 ((tickMs * 10 + 999) / 1000);

  cardsPerModel = m: builtins.length m.cards + lib.foldl' (n: r: n + builtins.length r) 0 m.replicas;
  totalCards = lib.foldl' (n: m: n + cardsPerModel m) 0 models;

  # ------------------------------------------------------------- assertions

  modelAssertions =
    name: m:
    let
      at = "services.tenstorrent-serving.models.${lib.strings.escapeNixIdentifier name}";
      cardSet = key: cards: {
        assertion = builtins.length cards == m.tp;
        message = ''
          ${at}.${key}: tp = ${toString m.tp} needs exactly ${toString m.tp} card${
            lib.optionalString (m.tp == 2) "s"
          }, got ${toString (builtins.length cards)} (${showCards cards}). ${
            if builtins.length cards < m.tp then
              "Add the cabled partner card or set tp = 1."
            else
              "Remove cards, or run several replicas with `replicas = [ [ ... ] [ ... ] ]`."
          }'';
      };
      envTables = {
        flags = m.flags;
        extraEnvironment = m.extraEnvironment;
        coldEnvironment = m.coldEnvironment;
        warmEnvironment = m.warmEnvironment;
      };
      envNameOk = n: builtins.match "[A-Za-z_][A-Za-z0-9_]*" n != null;
    in
    [
      {
        assertion = builtins.match "[A-Za-z0-9][A-Za-z0-9_.-]{0,63}" name != null;
        message = "${at}: model names may use letters, digits, '-', '_' and '.', start with a letter or digit, and be at most 64 characters (they name slots and cache directories); rename the model.";
      }
      {
        assertion = m.cards != [ ] || m.replicas != [ ];
        message = "${at}: no cards given; set cards = [ ... ] to the ${toString m.tp} card(s) of this model, e.g. cards = [ \"0000:01:00.0\"${lib.optionalString (m.tp == 2) " \"0000:02:00.0\""} ].";
      }
      {
        assertion = m.cards == [ ] || m.replicas == [ ];
        message = "${at}: set either `cards` (one replica) or `replicas` (several), not both.";
      }
      {
        assertion = isAbsolute m.checkpoint;
        message = "${at}.checkpoint: `${m.checkpoint}` is not an absolute path; give the checkpoint's full path, e.g. \"/var/lib/tt-serving/models/model.gguf\".";
      }
      {
        assertion = m.worker != [ ] && builtins.head m.worker != "";
        message = "${at}.worker: the command is empty; give an argv like [ \"/path/to/worker\" ] or remove the option to use tt-worker.";
      }
    ]
    ++ lib.optional (m.cards != [ ]) (cardSet "cards" m.cards)
    ++ lib.imap0 (i: r: cardSet "replicas[${toString i}]" r) m.replicas
    ++ lib.concatLists (
      lib.mapAttrsToList (
        table: vars:
        map (var: {
          assertion = envNameOk var && !(builtins.elem var reservedEnv);
          message =
            if !(envNameOk var) then
              "${at}.${table}.${var}: `${var}` is not a valid environment variable name (letters, digits, '_'; not starting with a digit)."
            else
              "${at}.${table}.${var}: `${var}` is set by the daemon for every worker; remove it from ${table}.";
        }) (lib.attrNames vars)
      ) envTables
    );

  # Every (card, where) pair, to find cards claimed twice.
  claims = lib.concatLists (
    lib.mapAttrsToList (
      name: m:
      let
        at = "models.${lib.strings.escapeNixIdentifier name}";
      in
      lib.imap0 (i: c: {
        id = cardId c;
        where = "${at}.cards[${toString i}]";
      }) m.cards
      ++ lib.concatLists (
        lib.imap0 (
          r: set:
          lib.imap0 (i: c: {
            id = cardId c;
            where = "${at}.replicas[${toString r}][${toString i}]";
          }) set
        ) m.replicas
      )
    ) cfg.models
  );
  claimsById = lib.groupBy (c: c.id) claims;
  duplicateCards = lib.filterAttrs (_: cs: builtins.length cs > 1) claimsById;
in
{
  options.services.tenstorrent-serving = {
    enable = lib.mkEnableOption "tt-serving, the LLM serving daemon for Tenstorrent cards";

    package = lib.mkPackageOption pkgs "tt-serving" { };

    listenAddress = mkOption {
      type = types.str;
      default = "127.0.0.1";
      example = "0.0.0.0";
      description = ''
        Address of the public gRPC inference port (Inference,
        `grpc.health.v1`, reflection). Loopback by default; bind `0.0.0.0` or
        `::` only behind a firewall or a proxy.
      '';
    };

    port = mkOption {
      type = types.port;
      default = 50051;
      description = "Port of the public gRPC inference endpoint.";
    };

    openFirewall = mkOption {
      type = types.bool;
      default = false;
      description = "Whether to open {option}`port` in the firewall.";
    };

    user = mkOption {
      type = types.str;
      default = "tt-serving";
      description = ''
        User the daemon and its workers run as. The default user is created;
        any other must exist.
      '';
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
        Group owning the control socket: its members may use `ttctl` for
        read-only commands (status, logs, generate); destructive ones
        (resets, borrowing cards) and taking the card locks in
        {option}`settings.daemon.lock_dir` need {option}`adminGroup`. The
        group is created. `null`: only the service user (and root) may use
        `ttctl`.
      '';
    };

    environmentFile = mkOption {
      type = types.nullOr types.path;
      default = null;
      example = "/run/secrets/tt-serving.env";
      description = ''
        File of `NAME=value` lines loaded into the daemon's environment
        (systemd `EnvironmentFile=`), for example `RUST_LOG`. Kept out of the
        Nix store. Workers only see `PATH`, `HOME`, `LANG`, `LC_ALL`, `TZ` and
        `RUST_LOG` from it; give workers their variables with
        `models.<name>.extraEnvironment`.
      '';
    };

    adminGroup = mkOption {
      type = types.nullOr types.str;
      default = null;
      example = "tt-admin";
      description = ''
        Group whose members may use `ttctl`'s destructive commands (card
        reset and borrow, slot restart, cache build and rm, reload); rendered
        as `daemon.control_admin_group`. The daemon checks the caller's
        credentials on the control socket, so members also need access to
        the socket: put them in {option}`controlSocketGroup` too. The group
        is created. `null`: only root may use those commands; members of
        {option}`controlSocketGroup` keep the read-only ones (status, logs,
        cache ls, generate).
      '';
    };

    tokensFile = mkOption {
      type = types.nullOr types.str;
      default = null;
      example = "/run/secrets/tt-serving-tokens";
      description = ''
        File of bearer tokens for the public port, one per line (`#`
        comments and blank lines ignored). When set, Inference and
        reflection need the metadata `authorization: Bearer <token>`;
        `grpc.health.v1` stays open for load balancers.

        Give a path as a string, outside the Nix store: everything in the
        store is readable by every local user, so a store path is refused.
        The file may be owned by root with mode 0600 (as secret managers
        such as agenix and sops-nix write them): systemd hands it to the
        daemon with `LoadCredential=`. The daemon reads it when it starts;
        restart the service after changing the tokens.
      '';
    };

    tls = {
      certFile = mkOption {
        type = types.nullOr types.str;
        default = null;
        example = "/var/lib/acme/llm.example.org/fullchain.pem";
        description = ''
          PEM certificate chain for TLS on the public port, with
          {option}`tls.keyFile` (both or neither). A path outside the Nix
          store, passed to the daemon with `LoadCredential=` and read when
          it starts. `null`: plaintext.
        '';
      };
      keyFile = mkOption {
        type = types.nullOr types.str;
        default = null;
        example = "/var/lib/acme/llm.example.org/key.pem";
        description = ''
          PEM private key of {option}`tls.certFile`. A path outside the Nix
          store (a store path would publish the key to every local user),
          passed to the daemon with `LoadCredential=`.
        '';
      };
    };

    ttSmiPackage = mkOption {
      type = types.nullOr types.package;
      default = pkgs.tt-smi or null;
      defaultText = literalExpression "pkgs.tt-smi or null";
      description = ''
        The `tt-smi` used to reset cards; rendered as `hardware.tt_smi`.
        `null`: look `tt-smi` up in the service's `PATH`.
      '';
    };

    checkConfig = mkOption {
      type = types.bool;
      default = true;
      description = ''
        Check the rendered config with `tt-servingd check-config --offline`
        when the system is built, so a bad config fails `nixos-rebuild`
        instead of the service. Turn off when cross-compiling.
      '';
    };

    hugepages = {
      enable = mkOption {
        type = types.bool;
        default = true;
        description = ''
          Whether to reserve 1 GiB hugepages for the engine's pinned host
          buffers and mount them at {option}`hugepages.mountPoint`.
        '';
      };
      count = mkOption {
        type = types.ints.positive;
        default = lib.max 1 totalCards;
        defaultText = literalExpression "number of cards used by all models (at least 1)";
        example = 4;
        description = ''
          Number of 1 GiB hugepages, reserved on the kernel command line
          (`hugepagesz=1G hugepages=N`, reliable from the next boot) and
          topped up at runtime when memory allows.
        '';
      };
      mountPoint = mkOption {
        type = types.path;
        default = "/dev/hugepages-1G";
        description = ''
          Where the `hugetlbfs` with `pagesize=1G` is mounted. tt-metal
          looks for `/dev/hugepages-1G`.
        '';
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
        The models to serve, by name; each becomes a `[models.<name>]` table
        and one slot per replica.
      '';
    };

    settings = mkOption {
      default = { };
      description = ''
        The daemon's configuration (`/etc/tt-serving/config.toml`), see
        `tt-servingd print-example-config`. Keys are the file's own
        (snake_case); options set to `null` are omitted, so the daemon's
        defaults apply. Models are configured under
        {option}`services.tenstorrent-serving.models`.
      '';
      example = literalExpression ''
        {
          daemon.log_format = "json";
          reset.policy = "always";
          reset.probe_command = [ "/opt/tt/bin/mesh-open-check" ];
        }
      '';
      type = types.submodule {
        freeformType = settingsFormat.type;
        options.daemon = {
          listen = mkOption {
            type = types.str;
            default =
              if lib.hasInfix ":" cfg.listenAddress then
                "[${cfg.listenAddress}]:${toString cfg.port}"
              else
                "${cfg.listenAddress}:${toString cfg.port}";
            defaultText = literalExpression ''"''${listenAddress}:''${toString port}"'';
            description = "Address of the public gRPC port; set {option}`listenAddress` and {option}`port` instead.";
          };
          control_socket = mkOption {
            type = types.path;
            default = "/run/tt-serving/control.sock";
            description = "The control socket `ttctl` talks to.";
          };
          control_socket_mode = mkOption {
            type = types.nullOr types.str;
            default = null;
            example = "0660";
            description = "Octal mode of the control socket. `null`: the daemon's default, `\"0660\"`.";
          };
          control_socket_group = mkOption {
            type = types.nullOr types.str;
            default = cfg.controlSocketGroup;
            defaultText = literalExpression "config.services.tenstorrent-serving.controlSocketGroup";
            description = "Group of the control socket; set {option}`controlSocketGroup` instead.";
          };
          control_admin_group = mkOption {
            type = types.nullOr types.str;
            default = cfg.adminGroup;
            defaultText = literalExpression "config.services.tenstorrent-serving.adminGroup";
            description = "Group allowed destructive control operations; set {option}`adminGroup` instead.";
          };
          state_dir = mkOption {
            type = types.path;
            default = "/var/lib/tt-serving";
            description = "Persistent state (the clean-shutdown record, quarantine reasons).";
          };
          cache_dir = mkOption {
            type = types.path;
            default = "/var/cache/tt-serving";
            description = "Root of the tensor caches, `<cache_dir>/<model>/<variant>/`.";
          };
          lock_dir = mkOption {
            type = types.path;
            default = "/run/lock/tenstorrent";
            description = ''
              One lock file per card (named by PCI address), shared with
              `ttctl` and benchmark scripts (`flock <lock_dir>/<BDF>.lock CMD`).
            '';
          };
        };
        options.inference = {
          tokens_file = mkOption {
            type = types.nullOr types.str;
            default = if cfg.tokensFile != null then "${credentialsDir}/tokens" else null;
            defaultText = literalExpression ''"/run/credentials/tenstorrent-serving.service/tokens" when tokensFile is set'';
            description = "The tokens file as the daemon sees it; set {option}`tokensFile` instead.";
          };
          tls_cert = mkOption {
            type = types.nullOr types.str;
            default = if cfg.tls.certFile != null then "${credentialsDir}/tls-cert" else null;
            defaultText = literalExpression ''"/run/credentials/tenstorrent-serving.service/tls-cert" when tls.certFile is set'';
            description = "The certificate as the daemon sees it; set {option}`tls.certFile` instead.";
          };
          tls_key = mkOption {
            type = types.nullOr types.str;
            default = if cfg.tls.keyFile != null then "${credentialsDir}/tls-key" else null;
            defaultText = literalExpression ''"/run/credentials/tenstorrent-serving.service/tls-key" when tls.keyFile is set'';
            description = "The private key as the daemon sees it; set {option}`tls.keyFile` instead.";
          };
        };
        options.hardware.tt_smi = mkOption {
          type = types.nullOr types.str;
          default = if cfg.ttSmiPackage != null then lib.getExe' cfg.ttSmiPackage "tt-smi" else null;
          defaultText = literalExpression ''lib.getExe' config.services.tenstorrent-serving.ttSmiPackage "tt-smi"'';
          description = "The tt-smi executable; set {option}`ttSmiPackage` instead.";
        };
      };
    };

    finalSettings = mkOption {
      type = types.attrsOf types.anything;
      readOnly = true;
      internal = true;
      description = "The settings as rendered into the config file (typed options, models and `settings`, nulls removed).";
    };
  };

  config = mkIf cfg.enable (mkMerge [
    {
      services.tenstorrent-serving.finalSettings = finalSettings;

      assertions = [
        {
          assertion = cfg.models != { };
          message = ''services.tenstorrent-serving is enabled but no model is configured; add one, e.g. services.tenstorrent-serving.models.smollm2 = { tp = 1; cards = [ 0 ]; checkpoint = "/var/lib/tt-serving/models/smollm2.gguf"; };'';
        }
        {
          assertion = cfg.port >= 1024;
          message = "services.tenstorrent-serving.port = ${toString cfg.port} is ${
            if cfg.port == 0 then "not a fixed port" else "a privileged port"
          }; the daemon runs as ${cfg.user} without CAP_NET_BIND_SERVICE. Use a port from 1024 to 65535 (the default is 50051), or put a proxy in front.";
        }
        {
          assertion = (cfg.tls.certFile == null) == (cfg.tls.keyFile == null);
          message = "services.tenstorrent-serving.tls: set both certFile and keyFile for TLS on the public port, or neither for plaintext.";
        }
      ]
      ++ lib.mapAttrsToList (name: path: {
        assertion = isAbsolute path && !(lib.hasPrefix "${builtins.storeDir}/" path);
        message =
          if !(isAbsolute path) then
            "services.tenstorrent-serving.${name} = \"${path}\" is not an absolute path; give the file's full path, e.g. \"/run/secrets/tt-serving-tokens\"."
          else
            "services.tenstorrent-serving.${name} = \"${path}\" is in the Nix store, which every local user can read; keep the file outside the store (e.g. /run/secrets/..., written by agenix or sops-nix) and give its path as a string.";
      }) secretFiles
      ++ lib.concatLists (lib.mapAttrsToList modelAssertions cfg.models)
      ++ lib.mapAttrsToList (id: cs: {
        assertion = false;
        message = "services.tenstorrent-serving: card ${id} is used by ${
          lib.concatMapStringsSep " and " (c: c.where) cs
        }; a card can belong to one slot only. Remove it from all but one.";
      }) duplicateCards;

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
          "services.tenstorrent-serving.hugepages.count = ${toString cfg.hugepages.count} is below the ${toString totalCards} cards the models use; tt-metal pins at least one 1 GiB hugepage per card. Raise hugepages.count to at least ${toString totalCards}.";

      environment.etc."tt-serving/config.toml".source = configFile;

      # ttctl (and tt-servingd check-config) for operators.
      environment.systemPackages = [ cfg.package ];
      environment.variables = lib.optionalAttrs (
        toString d.control_socket != "/run/tt-serving/control.sock"
      ) { TTCTL_SOCKET = toString d.control_socket; };

      users.users = lib.optionalAttrs (cfg.user == "tt-serving") {
        tt-serving = {
          isSystemUser = true;
          group = cfg.group;
          home = toString d.state_dir;
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
            "d ${toString d.lock_dir} 2775 ${cfg.user} ${cfg.adminGroup} - -"
          else
            "d ${toString d.lock_dir} 0755 ${cfg.user} ${cfg.group} - -"
        )
      ]
      ++ map (dir: "d ${toString dir} 0750 ${cfg.user} ${cfg.group} - -") unmanagedDirs;

      networking.firewall.allowedTCPPorts = lib.optional cfg.openFirewall cfg.port;

      systemd.services.tenstorrent-serving = {
        description = "tt-serving: language models on Tenstorrent cards";
        wantedBy = [ "multi-user.target" ];
        after = [
          "network.target"
          "systemd-tmpfiles-setup.service"
        ]
        ++ lib.optional cfg.hugepages.enable "tenstorrent-hugepages.service";
        wants = lib.optional cfg.hugepages.enable "tenstorrent-hugepages.service";
        # A switch that changes only models reloads the daemon (SIGHUP,
        # Type=notify-reload): unchanged slots keep serving, changed ones
        # restart, removed ones stop, added ones start. Settings the daemon
        # cannot change live (the daemon, hardware and reset sections)
        # restart it instead. See docs/nixos.md.
        reloadTriggers = [ configFile ];
        restartTriggers = [
          (builtins.hashString "sha256" (builtins.toJSON (removeAttrs finalSettings [ "models" ])))
        ];
        environment = {
          HOME = toString d.state_dir;
        };
        unitConfig.RequiresMountsFor = lib.optional cfg.hugepages.enable (toString cfg.hugepages.mountPoint);
        serviceConfig = {
          # systemd sends SIGHUP on reload and waits for RELOADING=1 then
          # READY=1, so `systemctl reload` returns once the reload is done.
          Type = "notify-reload";
          NotifyAccess = "main";
          ExecStart = "${cfg.package}/bin/tt-servingd run --config /etc/tt-serving/config.toml";
          User = cfg.user;
          Group = cfg.group;
          # Membership lets the daemon hand the control socket to the group.
          # The admin group: lock files are given to it (mode 0660).
          SupplementaryGroups =
            lib.optional (cfg.controlSocketGroup != null) cfg.controlSocketGroup
            ++ lib.optional (cfg.adminGroup != null) cfg.adminGroup;
          EnvironmentFile = lib.optional (cfg.environmentFile != null) cfg.environmentFile;
          # Tokens, certificate and key, rendered as paths under
          # /run/credentials/tenstorrent-serving.service/ (mode 0400, the
          # service's user), read by the daemon once at start.
          LoadCredential = credentials;

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

          StateDirectory = lib.optional (stateDirName != null) stateDirName;
          StateDirectoryMode = "0750";
          CacheDirectory = lib.optional (cacheDirName != null) cacheDirName;
          CacheDirectoryMode = "0750";
          # The control socket's directory; the socket itself is 0660 and
          # owned by controlSocketGroup, so the directory stays traversable.
          RuntimeDirectory = lib.optional (runtimeDirName != null) runtimeDirName;
          RuntimeDirectoryMode = "0755";
          ReadWritePaths = [
            (toString d.lock_dir)
          ]
          ++ map toString unmanagedDirs
          # "-": the mount may be missing; the engine then says so itself.
          ++ lib.optional cfg.hugepages.enable "-${toString cfg.hugepages.mountPoint}";
          WorkingDirectory = toString d.state_dir;
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
          ProtectClock = true;
          ProtectControlGroups = true;
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
          # /dev/shm stays shared: tt-metal's own per-chip lock lives there
          # (TT_UMD_LOCK.CHIP_IN_USE_*) and must be seen by other processes.
          PrivateIPC = false;
          RemoveIPC = true;
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
          where = toString cfg.hugepages.mountPoint;
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
