#!/usr/bin/env python3
"""Checks on what tests/nix/eval.nix returns (JSON on stdin), for run.sh.

  inspect.py toml-selftest            the toml.nix self-test round-trips
  inspect.py example OUT_TOML         a good example: no failed assertion,
                                      TOML written to OUT_TOML round-trips,
                                      the unit has what the module promises
  inspect.py host OUT_TOML            the VM test's host: no failed assertion,
                                      TOML written to OUT_TOML round-trips
  inspect.py variant                  the module on a nixpkgs without
                                      hardware.tenstorrent and tt-smi
  inspect.py broken EXPECTED          a broken config is rejected by an
                                      assertion whose message contains EXPECTED
  inspect.py warns EXPECTED           a config evaluates with no failed
                                      assertion and a warning containing EXPECTED

Prints what is wrong and exits 1 on failure.
"""
import json
import sys

try:
    import tomllib
except ModuleNotFoundError:  # Python < 3.11
    tomllib = None

problems = []


def check(cond, what):
    if not cond:
        problems.append(what)


def roundtrip(text, value, what):
    if tomllib is None:
        print(f"note: {what}: TOML round trip not checked (Python {sys.version_info[0]}.{sys.version_info[1]} has no tomllib)")
        return
    try:
        parsed = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        problems.append(f"{what}: rendered TOML does not parse: {e}")
        return
    check(parsed == value, f"{what}: TOML parses to something else than the settings:\n  toml:     {json.dumps(parsed, sort_keys=True)}\n  settings: {json.dumps(value, sort_keys=True)}")


UMD_LISTENERS = "/tmp/tt_umd_listeners"


def card_count(settings):
    """Cards the models use, as the module counts them for hugepages."""
    return sum(len(m.get("cards", [])) + sum(len(r) for r in m.get("replicas", [])) for m in settings.get("models", {}).values())


def umd_sharing(d):
    """What tt-umd shares with processes outside the unit (module.nix says why)."""
    sc = d["unit"]["serviceConfig"]
    # The per-chip robust mutexes in /dev/shm (TT_UMD_LOCK.*): not private,
    # and not removed with the service user's IPC objects when the unit stops.
    check(sc.get("PrivateIPC") is False, f"serviceConfig.PrivateIPC = {sc.get('PrivateIPC')!r}, want False (tt-umd's TT_UMD_LOCK.* live in the host's /dev/shm)")
    check(sc.get("RemoveIPC") is False, f"serviceConfig.RemoveIPC = {sc.get('RemoveIPC')!r}, want False: RemoveIPC=true deletes tt-umd's /dev/shm/TT_UMD_LOCK.* files when the unit stops")
    # Warm-reset listeners: the host's directory inside the private /tmp.
    check(sc.get("PrivateTmp") is True, f"serviceConfig.PrivateTmp = {sc.get('PrivateTmp')!r}, want True")
    binds = sc.get("BindPaths", [])
    binds = [binds] if isinstance(binds, str) else binds
    check(UMD_LISTENERS in binds, f"serviceConfig.BindPaths = {binds!r} lacks {UMD_LISTENERS} (tt-umd's warm-reset listeners would stay in the private /tmp)")
    want_rule = f"d {UMD_LISTENERS} 1777 root root - -"
    check(want_rule in d["tmpfiles"], f"no tmpfiles rule {want_rule!r} for tt-umd's warm-reset listeners: {d['tmpfiles']}")


def example(d, out_toml):
    check(d["failedAssertions"] == [], f"failed assertions: {d['failedAssertions']}")
    with open(out_toml, "w", encoding="utf-8") as f:
        f.write(d["toml"])
    roundtrip(d["toml"], d["settings"], "settings")

    s = d["settings"]
    pkg = d["package"]
    for name, m in s.get("models", {}).items():
        check(m.get("worker"), f"models.{name}: no worker rendered")
        check(not any(v is None for v in m.values()), f"models.{name}: a null survived rendering")

    u = d["unit"]
    sc = u["serviceConfig"]
    want = {
        "Type": "notify",
        "OOMPolicy": "continue",
        "NotifyAccess": "main",
        "Restart": "on-failure",
        "DevicePolicy": "closed",
        "ProtectSystem": "strict",
        "ProtectHome": True,
        "PrivateTmp": True,
        "NoNewPrivileges": True,
        "LockPersonality": True,
        "LimitMEMLOCK": "infinity",
        "KillMode": "mixed",
        "Delegate": "yes",
        "ExecStart": f"{pkg}/bin/tt-servingd run --config /etc/tt-serving/config.toml",
        # The reload's outcome reaches `systemctl reload`'s exit status.
        "ExecReload": f"+{pkg}/bin/ttctl --socket {s['daemon']['control_socket']} reload",
    }
    for k, v in want.items():
        check(sc.get(k) == v, f"serviceConfig.{k} = {sc.get(k)!r}, want {v!r}")
    check(sc.get("DeviceAllow") == ["char-tenstorrent rw"], f"serviceConfig.DeviceAllow = {sc.get('DeviceAllow')!r}")
    check(sc.get("MemoryDenyWriteExecute") is not True, "MemoryDenyWriteExecute must stay off (engines JIT)")
    check(sc.get("ProtectControlGroups") in (False, "private"), f"ProtectControlGroups = {sc.get('ProtectControlGroups')!r}: /sys/fs/cgroup read-only keeps the daemon out of its delegated cgroup")
    for k in ("WatchdogSec", "TimeoutStartSec", "SystemCallFilter", "RestrictAddressFamilies", "StateDirectory", "CacheDirectory", "RuntimeDirectory"):
        check(sc.get(k), f"serviceConfig.{k} missing")
    start = int(str(sc.get("TimeoutStartSec", "0s")).rstrip("s") or 0)
    deadlines = [m.get("readiness", {}).get("deadline_secs", 1800) for m in s.get("models", {}).values()]
    check(start > max(deadlines, default=1800), f"TimeoutStartSec {start}s does not cover the readiness deadline {max(deadlines, default=1800)}s")
    lock_dir = s["daemon"]["lock_dir"]
    check(lock_dir in sc.get("ReadWritePaths", []), f"lock dir {lock_dir} not in ReadWritePaths")
    # Card locks: only the admin group may write the lock dir (the daemon
    # refuses one any other group can write), and the daemon, which gives
    # lock files to that group, is in it.
    admin = s["daemon"].get("control_admin_group")
    user = d["unit"]["serviceConfig"]["User"]
    want_rule = f"d {lock_dir} 2775 {user} {admin} - -" if admin else f"d {lock_dir} 0755 {user} {d['unit']['serviceConfig']['Group']} - -"
    check(want_rule in d["tmpfiles"], f"no tmpfiles rule {want_rule!r} for the lock dir: {d['tmpfiles']}")
    if admin:
        check(admin in sc.get("SupplementaryGroups", []), f"daemon not in the admin group {admin}")

    etc = d["etc"].get("tt-serving/config.toml", {}).get("source")
    check(etc is not None, "environment.etc.\"tt-serving/config.toml\" missing")
    # A models-only change reloads (SIGHUP) instead of restarting: the config
    # is a reload trigger, and the restart trigger covers only the sections
    # the daemon cannot change live.
    check(etc in u.get("reloadTriggers", []), "the rendered config is not a reload trigger")
    check(etc not in u.get("restartTriggers", []), "the rendered config is a restart trigger: every switch would restart the daemon")
    check(len(u.get("restartTriggers", [])) == 1, f"restartTriggers = {u.get('restartTriggers')!r}, want the daemon-level sections' hash")
    check(any(p.startswith("tt-serving") for p in d["systemPackages"]), "package (ttctl) not on the system path")
    group = s["daemon"].get("control_socket_group")
    if group:
        check(group in d["groups"], f"group {group} not created")
        check(group in sc.get("SupplementaryGroups", []), f"daemon not in {group}")
    check(d["hardwareTenstorrentEnable"] is True, "hardware.tenstorrent.enable not defaulted to true")
    # containerRuntime: the runtime enabled, its socket's group joined, the
    # docker client on the unit's PATH pointed at the socket.
    runtime = d.get("containerRuntime")
    if runtime:
        check(d["virtualisation"].get(runtime, {}).get("enable") is True, f"virtualisation.{runtime}.enable not set")
        check(runtime in sc.get("SupplementaryGroups", []), f"daemon not in the {runtime} socket group")
        check(u.get("environment", {}).get("DOCKER_HOST") == "unix:///run/docker.sock", "DOCKER_HOST not the runtime's socket")
        check(any("docker" in str(p) for p in u.get("path", [])), f"no docker client on the unit's path: {u.get('path')}")
        if runtime == "podman":
            check(d["virtualisation"]["podman"].get("dockerSocket", {}).get("enable") is True, "podman's Docker-compatible socket not enabled")
    else:
        check("DOCKER_HOST" not in u.get("environment", {}), "DOCKER_HOST set without a containerRuntime")
    if admin:
        check(admin in d["groups"], f"admin group {admin} not created")

    # Secrets reach the daemon as systemd credentials, never through the
    # store, and the rendered paths point at the credentials directory.
    creds = dict(c.split(":", 1) for c in sc.get("LoadCredential", []))
    inference = s.get("inference", {})
    for key, cred in (("tokens_file", "tokens"), ("tls_cert", "tls-cert"), ("tls_key", "tls-key")):
        if key in inference:
            check(inference[key] == f"/run/credentials/tenstorrent-serving.service/{cred}", f"inference.{key} = {inference[key]!r} is not the {cred} credential")
            check(cred in creds, f"inference.{key} rendered but no LoadCredential={cred}:...")
        else:
            check(cred not in creds, f"LoadCredential={cred} without inference.{key}")
    for name, model in s.get("models", {}).items():
        cred = f"model-{name}-env"
        if "env_file" in model:
            check(model["env_file"] == f"/run/credentials/tenstorrent-serving.service/{cred}", f"models.{name}.env_file = {model['env_file']!r} is not the {cred} credential")
            check(cred in creds, f"models.{name}.env_file rendered but no LoadCredential={cred}:...")
        else:
            check(cred not in creds, f"LoadCredential={cred} without models.{name}.env_file")
    for cred, path in creds.items():
        check(not path.startswith("/nix/store/"), f"credential {cred} comes from the store: {path}")
    check(("tls_cert" in inference) == ("tls_key" in inference), "TLS certificate and key must be rendered together")

    umd_sharing(d)

    # Hugepages: 4 x 1 GiB per card by default (Tenstorrent's
    # hugepages-setup.sh), at least 4; a count the host sets wins.
    hp = d["hugepages"]
    cards = card_count(s)
    check(hp["defaultCount"] == 4 * max(1, cards), f"hugepages.count defaults to {hp['defaultCount']}, want 4 per card: {4 * max(1, cards)} for {cards} cards")
    if hp["countIsDefault"]:
        check(hp["count"] == 4 * max(1, cards), f"hugepages.count = {hp['count']} without a host setting, want {4 * max(1, cards)}")
    if d["hugepagesUnit"] is not None:
        mounts = [m for m in d["mounts"] if m["type"] == "hugetlbfs"]
        check(len(mounts) == 1 and "pagesize=1G" in mounts[0]["options"], f"hugetlbfs mount: {mounts}")
        check(f"hugepages={hp['count']}" in d["kernelParams"], f"no hugepages={hp['count']} kernel parameter: {d['kernelParams']}")
        check(f"want={hp['count']}\n" in d["hugepagesUnit"].get("script", ""), f"tenstorrent-hugepages.service does not top the pool up to {hp['count']}")

    listen = s["daemon"]["listen"]
    port = int(listen.rsplit(":", 1)[1])
    if d["firewallTCPPorts"]:
        check(d["firewallTCPPorts"] == [port], f"firewall opens {d['firewallTCPPorts']}, listen is {listen}")


def host(d, out_toml):
    check(d["failedAssertions"] == [], f"failed assertions: {d['failedAssertions']}")
    with open(out_toml, "w", encoding="utf-8") as f:
        f.write(d["toml"])
    roundtrip(d["toml"], d["settings"], "settings")
    umd_sharing(d)


def variant(d):
    check(d["failedAssertions"] == [], f"failed assertions: {d['failedAssertions']}")
    check(d["hardwareTenstorrentEnable"] is None, "hardware.tenstorrent set although the option does not exist")
    check("tt_smi" not in d["settings"].get("hardware", {}), "hardware.tt_smi rendered without a tt-smi package")


def broken(d, expected):
    failed = d["failedAssertions"]
    check(failed, "the config was accepted; it must be rejected by an assertion")
    if failed:
        check(any(expected in m for m in failed), "no assertion says:\n  " + expected + "\nthe module said:\n  " + "\n  ".join(failed))


def warns(d, expected):
    check(d["failedAssertions"] == [], f"failed assertions: {d['failedAssertions']}")
    check(any(expected in w for w in d["warnings"]), "no warning says:\n  " + expected + "\nthe module warned:\n  " + "\n  ".join(d["warnings"]))


def main():
    cmd = sys.argv[1]
    d = json.load(sys.stdin)
    if cmd == "toml-selftest":
        roundtrip(d["rendered"], d["value"], "toml.nix self-test")
    elif cmd == "example":
        example(d, sys.argv[2])
    elif cmd == "host":
        host(d, sys.argv[2])
    elif cmd == "variant":
        variant(d)
    elif cmd == "broken":
        broken(d, sys.argv[2])
    elif cmd == "warns":
        warns(d, sys.argv[2])
    else:
        sys.exit(f"inspect.py: unknown command {cmd}")
    for p in problems:
        print(f"  {p}")
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
