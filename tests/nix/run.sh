#!/usr/bin/env bash
# Nix checks that run without a Nix store or nixpkgs (Nix 2.8 is enough:
# `apt-get install nix-bin`):
#
#   1. `nix-instantiate --parse` on every .nix file in the repository.
#   2. With NIXPKGS_LIB (a checkout of nixpkgs' lib/ directory, e.g. from
#      github.com/nix-community/nixpkgs.lib; the repository never carries
#      it): module.nix evaluated through lib.evalModules with the stand-ins
#      in this directory, for every host config in examples/: no assertion
#      fails, the rendered TOML round-trips and passes
#      `tt-servingd check-config --offline`, the unit has what the module
#      promises (RemoveIPC=false and tt-umd's warm-reset listener directory
#      bound from the host, with its tmpfiles rule, among it; hugepages.count
#      4 per card by default) and its TimeoutStopSec= covers the `stop limit`
#      check-config prints; a hugepages.count below the cards warns; every
#      config in tests/nix/broken/ is rejected by a module
#      assertion (Nix matters: secrets, ports, TLS pairs), every config in
#      tests/nix/invalid/ evaluates and is rejected by check-config (the
#      build-time check), each with the message on its `# expect:` line.
#   3. Without NIXPKGS_LIB: a loud SKIPPED line instead of 2.
#
# Environment: NIXPKGS_LIB; TT_SERVINGD (default target/debug/tt-servingd);
# TT_NIX_OUT, where rendered files go (default target/nix-eval).
# Ends with `nix: N passed, M failed`; exits 1 on any failure.
set -uo pipefail
cd "$(dirname "$0")/../.."
root=$PWD

passed=0
failed=0
pass() {
    passed=$((passed + 1))
    echo "ok   $*"
}
fail() {
    failed=$((failed + 1))
    echo "FAIL $*"
}
summary() {
    echo "nix: $passed passed, $failed failed"
    [ "$failed" -eq 0 ]
    exit
}

if ! command -v nix-instantiate >/dev/null; then
    fail "nix-instantiate not found; install Nix (apt-get install -y nix-bin)"
    summary
fi
echo "== $(nix-instantiate --version)"

# Evaluate without a store: nothing is built or copied.
eval_json() {
    nix-instantiate --store dummy:// --eval --strict --json "$@"
}

echo "== parse every .nix file"
while IFS= read -r -d '' f; do
    if err=$(nix-instantiate --parse "$f" 2>&1 >/dev/null); then
        pass "parse ${f#./}"
    else
        fail "parse ${f#./}"
        printf '%s\n' "$err" | sed 's/^/    /'
    fi
done < <(find . \( -path ./target -o -path ./.git -o -name node_modules \) -prune -o -name '*.nix' -type f -print0 | sort -z)

if [ -z "${NIXPKGS_LIB:-}" ]; then
    echo "SKIPPED: module evaluation (NIXPKGS_LIB not set: point it at a checkout of nixpkgs' lib/ directory, e.g. from github.com/nix-community/nixpkgs.lib, to evaluate module.nix for every example and check the rendered configs with tt-servingd check-config)"
    summary
fi

echo "== module evaluation with nixpkgs lib at $NIXPKGS_LIB"
lib=$(cd "$NIXPKGS_LIB" 2>/dev/null && pwd)
if [ -z "$lib" ] || [ ! -f "$lib/default.nix" ] || [ ! -f "$lib/modules.nix" ]; then
    fail "NIXPKGS_LIB=$NIXPKGS_LIB is not nixpkgs' lib/ directory (no default.nix and modules.nix there)"
    summary
fi
echo "   lib version: $(eval_json -E "(import $lib).version" 2>&1)"
if ! command -v python3 >/dev/null; then
    fail "python3 not found; the harness decodes the evaluation's JSON with it"
    summary
fi
servingd=${TT_SERVINGD:-$root/target/debug/tt-servingd}
if [ ! -x "$servingd" ]; then
    fail "$servingd is not executable; build it (cargo build -p tt-servingd --bin tt-servingd) or set TT_SERVINGD"
    servingd=
fi
out=${TT_NIX_OUT:-$root/target/nix-eval}
mkdir -p "$out"
inspect="python3 tests/nix/inspect.py"

if json=$(eval_json tests/nix/toml-test.nix 2>&1) && $inspect toml-selftest <<<"$json"; then
    pass "toml.nix self-test (quoted keys, escapes, nesting, lists of lists)"
else
    fail "toml.nix self-test"
    printf '%s\n' "$json" | tail -5 | sed 's/^/    /'
fi

# A host config: evaluate, check with inspect.py (KIND: example, or host
# for the VM test's host, which has no hugepages and no driver), write and
# show the TOML, run check-config on it.
check_host() {
    local file=$1 kind=$2 name json problems res
    name=$(basename "$file" .nix)
    if ! json=$(eval_json tests/nix/eval.nix --argstr libPath "$lib" --argstr example "$root/$file" 2>&1); then
        fail "$file: evaluation"
        printf '%s\n' "$json" | tail -15 | sed 's/^/    /'
        return
    fi
    printf '%s\n' "$json" >"$out/$name.json"
    if problems=$($inspect "$kind" "$out/$name.toml" <<<"$json"); then
        pass "$file: evaluates, TOML round-trips, unit as promised ($out/$name.json)"
    else
        fail "$file: evaluation result"
        printf '%s\n' "$problems"
    fi
    echo "   --- $out/$name.toml"
    sed 's/^/   | /' "$out/$name.toml"
    if [ -n "$servingd" ]; then
        if res=$("$servingd" check-config --offline "$out/$name.toml" 2>&1); then
            pass "$file: tt-servingd check-config --offline: $(head -1 <<<"$res")"
        else
            fail "$file: tt-servingd check-config --offline rejects the rendered config"
            printf '%s\n' "$res" | sed 's/^/    /'
            return
        fi
        # One stop budget: systemd must not kill a clean stop the daemon
        # may still be making (Config::stop_limit()).
        local limit stop
        limit=$(sed -n 's/^stop limit: \([0-9]*\) s$/\1/p' <<<"$res")
        stop=$(python3 -c 'import json, sys; print(str(json.load(sys.stdin)["unit"]["serviceConfig"]["TimeoutStopSec"]).rstrip("s"))' <"$out/$name.json")
        if [ -z "$limit" ]; then
            fail "$file: check-config printed no 'stop limit: N s' line; rebuild $servingd"
        elif [ "$stop" -gt "$limit" ] 2>/dev/null; then
            pass "$file: TimeoutStopSec=${stop}s covers the daemon's stop limit ${limit}s"
        else
            fail "$file: TimeoutStopSec=${stop}s does not cover the daemon's stop limit ${limit}s: systemd would SIGKILL a clean stop"
        fi
    fi
}

for ex in examples/*.nix; do
    check_host "$ex" example
done
check_host tests/nix/vm-host.nix host

# The systemd guest's files (tests/guest/) are the module's rendering of
# tests/guest/host.nix, never a hand-written copy: rendered here and
# compared; TT_NIX_WRITE_GUEST=1 writes them instead.
check_host tests/guest/host.nix host
guest_out="$out/guest"
rm -rf "$guest_out"
if res=$(python3 tests/nix/render-guest.py "$guest_out" <"$out/host.json" 2>&1); then
    if [ "${TT_NIX_WRITE_GUEST:-}" = 1 ]; then
        cp "$guest_out"/* tests/guest/
        pass "tests/guest/: written from module.nix (TT_NIX_WRITE_GUEST=1)"
    else
        stale=
        for f in "$guest_out"/*; do
            if ! diff -u "tests/guest/$(basename "$f")" "$f" >"$out/guest-$(basename "$f").diff" 2>&1; then
                stale="$stale $(basename "$f")"
                sed 's/^/    /' "$out/guest-$(basename "$f").diff" | head -40
            fi
        done
        if [ -z "$stale" ]; then
            pass "tests/guest/: the unit, config, tmpfiles and sysusers files are what module.nix renders for tests/guest/host.nix"
        else
            fail "tests/guest/:$stale differ from what module.nix renders for tests/guest/host.nix; rewrite them with TT_NIX_WRITE_GUEST=1 tests/nix/run.sh"
        fi
    fi
else
    fail "tests/guest/host.nix: rendering the guest's files"
    printf '%s\n' "$res" | sed 's/^/    /'
fi

# The systemd generations: ProtectControlGroups= is "private" from 257 (a
# writable cgroup namespace), false before; below 247 the module refuses.
for v in 252.39:false 256.8:false 257.9:private; do
    version=${v%%:*}
    want=${v#*:}
    # The host file says 252; mkForce another version over it.
    got=$(nix-instantiate --store dummy:// --eval --strict --json -E "
      let lib = import $lib; e = lib.evalModules { modules = [
        (import $root/tests/nix/stubs.nix { })
        $root/module.nix
        $root/tests/guest/host.nix
        { _module.args.pkgs = import $root/tests/nix/pkgs.nix { inherit lib; withTtSmi = true; };
          systemd.package = lib.mkForce { version = \"$version\"; }; }
      ]; }; in e.config.systemd.services.tenstorrent-serving.serviceConfig.ProtectControlGroups" 2>&1)
    if [ "$got" = "$want" ] || [ "$got" = "\"$want\"" ]; then
        pass "systemd $version: ProtectControlGroups=$want"
    else
        fail "systemd $version: ProtectControlGroups is $got, want $want"
    fi
done
if json=$(nix-instantiate --store dummy:// --eval --strict --json -E "
      let lib = import $lib; e = lib.evalModules { modules = [
        (import $root/tests/nix/stubs.nix { })
        $root/module.nix
        $root/tests/guest/host.nix
        { _module.args.pkgs = import $root/tests/nix/pkgs.nix { inherit lib; withTtSmi = true; };
          systemd.package = lib.mkForce { version = \"246\"; }; }
      ]; }; in map (a: a.message) (builtins.filter (a: !a.assertion) e.config.assertions)" 2>&1) &&
    grep -q "needs systemd 247 or later" <<<"$json"; then
    pass "systemd 246: refused by the module's assertion"
else
    fail "systemd 246: no assertion failure naming systemd 247: $json"
fi

# An older nixpkgs: no hardware.tenstorrent option, no tt-smi package.
if json=$(eval_json tests/nix/eval.nix --argstr libPath "$lib" --argstr example "$root/examples/minimal.nix" \
    --arg withTenstorrentOption false --arg withTtSmi false 2>&1) &&
    problems=$($inspect variant <<<"$json"); then
    pass "examples/minimal.nix on a nixpkgs without hardware.tenstorrent and tt-smi"
else
    fail "examples/minimal.nix on a nixpkgs without hardware.tenstorrent and tt-smi"
    printf '%s\n' "${problems:-$json}" | tail -15 | sed 's/^/    /'
fi

# Fewer hugepages than cards: a warning that says what to set, not an
# assertion.
expected="services.tenstorrent-serving.hugepages.count = 1 is below the 2 cards the models use"
problems=
if json=$(eval_json tests/nix/eval.nix --argstr libPath "$lib" --argstr example "$root/tests/nix/hugepages-below-cards.nix" --argstr mode assertions 2>&1) &&
    problems=$($inspect warns "$expected" <<<"$json"); then
    pass "tests/nix/hugepages-below-cards.nix: warns: $expected"
else
    fail "tests/nix/hugepages-below-cards.nix: no warning as expected"
    printf '%s\n' "${problems:-$json}" | tail -15 | sed 's/^/    /'
fi

# What a switch does: a model change moves only the reload trigger, a
# daemon-level change moves the restart trigger.
if json=$(eval_json tests/nix/triggers.nix --argstr libPath "$lib" 2>&1) &&
    problems=$(python3 -c '
import json, sys
t = json.load(sys.stdin)
b, m, d, e = t["base"], t["modelChange"], t["daemonChange"], t["envFileChange"]
bad = []
if m["credentials"] != b["credentials"]: bad.append("a model flag change moves LoadCredential= (the switch would restart the daemon)")
if "model-smollm2-env:/run/secrets/smollm2.env" not in e["credentials"]: bad.append(f"a model env_file is not a credential: {e['credentials']}")
if m["restart"] != b["restart"]: bad.append("a model flag change moves the restart trigger (the switch would restart the daemon)")
if m["reload"] == b["reload"]: bad.append("a model flag change does not move the reload trigger (the switch would not reload)")
if d["restart"] == b["restart"]: bad.append("a daemon-level change does not move the restart trigger (it would only be reported, never applied)")
print("\n".join(bad)); sys.exit(1 if bad else 0)
' <<<"$json"); then
    pass "switch: a model change reloads, a daemon-level change restarts, a model env_file is a credential (restart)"
else
    fail "switch triggers"
    printf '%s\n' "${problems:-$json}" | tail -15 | sed 's/^/    /'
fi

for bad in tests/nix/broken/*.nix; do
    expected=$(sed -n 's/^# expect: //p' "$bad" | head -1)
    if [ -z "$expected" ]; then
        fail "$bad: no '# expect: MESSAGE' line"
        continue
    fi
    problems=
    if json=$(eval_json tests/nix/eval.nix --argstr libPath "$lib" --argstr example "$root/$bad" --argstr mode assertions 2>&1) &&
        problems=$($inspect broken "$expected" <<<"$json"); then
        pass "$bad: rejected: $expected"
    else
        fail "$bad: not rejected as expected"
        printf '%s\n' "${problems:-$json}" | tail -15 | sed 's/^/    /'
    fi
done

# Configs the daemon's validator rejects: the module has no assertion for
# them; the build-time check-config (checkConfig) stops them.
for bad in tests/nix/invalid/*.nix; do
    expected=$(sed -n 's/^# expect: //p' "$bad" | head -1)
    if [ -z "$expected" ]; then
        fail "$bad: no '# expect: MESSAGE' line"
        continue
    fi
    if [ -z "$servingd" ]; then
        fail "$bad: not checked (no tt-servingd)"
        continue
    fi
    name=invalid-$(basename "$bad" .nix)
    if ! json=$(eval_json tests/nix/eval.nix --argstr libPath "$lib" --argstr example "$root/$bad" 2>&1); then
        fail "$bad: evaluation"
        printf '%s\n' "$json" | tail -15 | sed 's/^/    /'
        continue
    fi
    problems=$(python3 -c '
import json, sys
d = json.load(sys.stdin)
open(sys.argv[1], "w", encoding="utf-8").write(d["toml"])
if d["failedAssertions"]: print("  a module assertion failed (this belongs in broken/):", d["failedAssertions"])
' "$out/$name.toml" <<<"$json")
    res=$("$servingd" check-config --offline "$out/$name.toml" 2>&1)
    rc=$?
    if [ -z "$problems" ] && [ "$rc" -ne 0 ] && grep -qF -- "$expected" <<<"$res"; then
        pass "$bad: rejected by check-config at build time: $expected"
    else
        fail "$bad: not rejected by check-config as expected (rc $rc)"
        printf '%s\n' "$problems" "$res" | sed 's/^/    /'
    fi
done

summary
