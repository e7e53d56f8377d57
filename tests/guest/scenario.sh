#!/bin/bash
# Runs inside the systemd guest (scripts/guest.sh boot), as root, from the
# share the host prepares (tests/systemd_guest.rs): the binaries in bin/,
# the model, the unit and config from tests/guest/. Each check writes one
# line to out/results: `ok NAME: detail` or `FAIL NAME: detail`; the host
# test fails on any FAIL or on a missing `done` line. Timings go to
# out/timings as `NAME SECONDS`.
set -u
share=/mnt/host
out=$share/out
mkdir -p "$out"
: >"$out/results"
: >"$out/timings"
bin=/usr/local/lib/tt-serving/bin
unit=tenstorrent-serving.service
cgroot=/sys/fs/cgroup/system.slice/$unit
export TTCTL_SOCKET=/run/tt-serving/control.sock

ok() { echo "ok $1: $2" | tee -a "$out/results"; }
fail() { echo "FAIL $1: $2" | tee -a "$out/results"; }
check() { # NAME DETAIL COMMAND...: ok when COMMAND succeeds
    local name=$1 detail=$2
    shift 2
    if "$@"; then ok "$name" "$detail"; else fail "$name" "$detail"; fi
}
timed() { # NAME COMMAND...: run, record its seconds, return its status
    local name=$1 t0 rc ms
    shift
    t0=$(date +%s%N)
    "$@"
    rc=$?
    ms=$((($(date +%s%N) - t0) / 1000000))
    printf '%s %d.%03d\n' "$name" $((ms / 1000)) $((ms % 1000)) >>"$out/timings"
    return $rc
}
slot_json() { "$bin/ttctl" status --json 2>/dev/null; }
slot_field() { # FIELD: the smollm2 slot's field from `ttctl status --json`
    slot_json | jq -r --arg f "$1" \
        '[.slots[]? | select(.name | startswith("smollm2"))][0][$f] // empty' 2>/dev/null
}
wait_for() { # SECONDS COMMAND...: poll until COMMAND succeeds
    local until=$((SECONDS + $1))
    shift
    while ! "$@"; do
        [ $SECONDS -ge $until ] && return 1
        sleep 1
    done
}
journal() { journalctl -u $unit --no-pager -o cat; }
metrics() { # the daemon's /metrics (no curl in the guest: bash's /dev/tcp)
    exec 3<>/dev/tcp/127.0.0.1/9464 || return 1
    printf 'GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' >&3
    cat <&3
    exec 3<&-
}
save_journal() { journalctl --no-pager -o short-monotonic >"$out/journal.txt" 2>&1; sync; }
# The journal reaches the host however the scenario ends.
trap save_journal EXIT
finish() {
    echo done >>"$out/results"
    exit 0
}

echo "systemd: $(systemctl --version | head -n 1)" >"$out/versions"
uname -r >>"$out/versions"

# --- the host as the module sets it up ------------------------------------
mkdir -p $bin /srv/models /etc/tt-serving /etc/systemd/system/$unit.d
cp $share/bin/* $bin/ && chmod 0755 $bin/*
cp $share/model.gguf /srv/models/smollm2.gguf && chmod 0644 /srv/models/smollm2.gguf
# The module's users, groups and tmpfiles rules, as rendered from
# module.nix (tests/guest/host.nix; tests/nix/render-guest.py).
mkdir -p /etc/sysusers.d /etc/tmpfiles.d
cp $share/sysusers.conf /etc/sysusers.d/tt-serving.conf
systemd-sysusers /etc/sysusers.d/tt-serving.conf
cp $share/tmpfiles.conf /etc/tmpfiles.d/tt-serving.conf
systemd-tmpfiles --create /etc/tmpfiles.d/tt-serving.conf
cp $share/tenstorrent-serving.service /etc/systemd/system/$unit
cp $share/config.toml /etc/tt-serving/config.toml
if ! id tt-serving >/dev/null 2>&1; then
    fail setup "systemd-sysusers did not create the module's tt-serving user: $(tail -n 5 "$out/../out/scenario.log" 2>/dev/null | tr '\n' ' ')"
    finish
fi
# Fake cards (no Tenstorrent card in a guest): the fake root is the one
# addition to the unit, writable because the fake tt-smi records resets
# in it. The module's ProtectControlGroups= for this systemd.
"$bin/tt-fakehw" create --root /var/lib/tt-fakehw --cards 1 --tt-fakehw-bin "$bin/tt-fakehw" >/dev/null
chown -R tt-serving:tt-serving /var/lib/tt-fakehw
# The card's firmware as the service's user: the files it creates (the
# fake's lock among them) are then the daemon's to open, as a real card's
# device node is the service user's by the udev rule.
runuser -u tt-serving -- "$bin/tt-fakehw" firmware --root /var/lib/tt-fakehw --detach >/dev/null
sysv=$(systemctl --version | awk 'NR==1 {print $2}')
pcg=false
[ "$sysv" -ge 257 ] && pcg=private
printf '[Service]\nReadWritePaths=/var/lib/tt-fakehw\nProtectControlGroups=%s\n' "$pcg" \
    >/etc/systemd/system/$unit.d/guest.conf
systemctl daemon-reload
if systemd-analyze verify /etc/systemd/system/$unit >"$out/verify.txt" 2>&1; then
    ok unit-verifies "systemd-analyze verify has no complaint"
else
    fail unit-verifies "$(tr '\n' ' ' <"$out/verify.txt")"
fi

# --- start: active only at READY, with the slot Ready ---------------------
# What the unit's status line says while it starts, polled (systemd keeps
# only the latest STATUS=).
(
    last=
    while :; do
        now=$(systemctl show -P StatusText $unit 2>/dev/null)
        [ -n "$now" ] && [ "$now" != "$last" ] && echo "$now" >>"$out/status-progress" && last=$now
        sleep 0.2
    done
) &
status_poll=$!
if timed start systemctl start $unit; then
    ok start "systemctl start returned 0"
else
    fail start "systemctl start failed: $(systemctl status $unit --no-pager 2>&1 | tail -n 5 | tr '\n' ' ')"
    finish
fi
check active "ActiveState=$(systemctl show -P ActiveState $unit) Type=$(systemctl show -P Type $unit)" \
    test "$(systemctl show -P ActiveState $unit)/$(systemctl show -P Type $unit)" = active/notify
status_text=$(systemctl show -P StatusText $unit)
check ready-at-start "STATUS=$status_text; slot state $(slot_field state)" test "$(slot_field state)" = ready
sleep 0.5
kill $status_poll
check status-progress "STATUS lines seen during the start: $(tr '\n' '|' <"$out/status-progress")" \
    test "$(wc -l <"$out/status-progress")" -ge 2
check delegate "slot cgroup $(ls -d $cgroot/slot-* 2>/dev/null | tr '\n' ' ') memory.current $(cat $cgroot/slot-*/memory.current 2>/dev/null)" \
    sh -c "test -d $cgroot/daemon && ls -d $cgroot/slot-* >/dev/null 2>&1 && test \"\$(cat $cgroot/slot-*/memory.current)\" -gt 0"
mem=$(slot_field worker_rss_bytes)
check memory-accounted "ttctl status worker_rss_bytes=$mem" test "${mem:-0}" -gt 0
# --- the hardening leaves every path the daemon and engines need ---------
main=$(systemctl show -P MainPID $unit)
in_unit() { nsenter -t "$main" -m -- "$@"; } # the unit's mount namespace
check path-state "StateDirectory /var/lib/tt-serving, the daemon's records: $(ls /var/lib/tt-serving | tr '\n' ' ')" \
    sh -c 'ls /var/lib/tt-serving | grep -q .'
check path-cache "CacheDirectory: tensor cache files $(find /var/cache/tt-serving -type f | wc -l)" \
    sh -c "test \"\$(find /var/cache/tt-serving -type f | wc -l)\" -gt 0"
check path-runtime "RuntimeDirectory: $(ls -l /run/tt-serving/control.sock 2>&1 | cut -c1-60)" test -S /run/tt-serving/control.sock
check path-locks "ReadWritePaths lock dir: $(ls /run/lock/tenstorrent | tr '\n' ' ')" \
    sh -c 'ls /run/lock/tenstorrent | grep -q .'
echo probe >/tmp/tt_umd_listeners/host-probe
echo probe >/tmp/host-only-probe
check path-umd-listeners "BindPaths: the unit sees the host's /tmp/tt_umd_listeners, and a private /tmp otherwise" \
    sh -c "nsenter -t $main -m -- test -f /tmp/tt_umd_listeners/host-probe && ! nsenter -t $main -m -- test -e /tmp/host-only-probe"
echo probe >/dev/shm/host-probe
check path-shm "PrivateIPC=false: the unit's /dev/shm is the host's (tt-umd's TT_UMD_LOCK.* are shared)" \
    in_unit test -f /dev/shm/host-probe
rm -f /dev/shm/host-probe /tmp/tt_umd_listeners/host-probe /tmp/host-only-probe
check path-system-ro "ProtectSystem=strict: /usr is read-only in the unit" \
    sh -c "nsenter -t $main -m -- sh -c 'touch /usr/probe' 2>/dev/null && exit 1 || exit 0"

warn=$(journal | grep -c 'cannot give the lock file' || true)
check no-lock-warning "'cannot give the lock file' lines: $warn" test "$warn" = 0

# --- reload: unchanged, refused, restored ---------------------------------
if timed reload-unchanged systemctl reload $unit; then
    ok reload-unchanged "systemctl reload of the same file returned 0"
else
    fail reload-unchanged "returned non-zero: $(journal | tail -n 3 | tr '\n' ' ')"
fi
# The reload was a destructive call made through ttctl (ExecReload, as
# root): its audit record is one journal entry with native fields
# (docs/ARCHITECTURE.md, "The audit trail").
audit_entry() { # the reload's record as the journal has it, or nothing
    journalctl -u $unit -o json --no-pager 2>/dev/null | jq -c 'select(.TT_AUDIT_OPERATION == "ttctl reload"
        and .TT_AUDIT_UID == "0" and .TT_AUDIT_OUTCOME == "ok")
        | {TT_AUDIT_OPERATION, TT_AUDIT_UID, TT_AUDIT_OUTCOME, TT_AUDIT_ADMITTED, SYSLOG_IDENTIFIER, _SYSTEMD_UNIT, _TRANSPORT, MESSAGE}' 2>/dev/null | head -n 1
}
wait_for 10 sh -c "test -n \"\$(journalctl -u $unit --no-pager -o cat TT_AUDIT_OPERATION='ttctl reload')\""
entry=$(audit_entry)
check audit-journal-fields "journalctl -u $unit -o json: ${entry:-no entry with TT_AUDIT_OPERATION=ttctl reload, TT_AUDIT_UID=0, TT_AUDIT_OUTCOME=ok}" \
    test -n "$entry"
by_field=$(journalctl -u $unit --no-pager -o cat TT_AUDIT_OUTCOME=ok TT_AUDIT_OPERATION='ttctl reload' | wc -l)
by_text=$(journal | grep -c 'audit: control action: ttctl reload by uid 0 (root): ok')
check audit-journal-once "entries of the reload's record: $by_field by its fields (journalctl -u $unit TT_AUDIT_OPERATION=...), $by_text by its text" \
    test "$by_field/$by_text" = 1/1
cp /etc/tt-serving/config.toml /etc/tt-serving/config.good
model_key() { sed -i "/^\[models\.smollm2\]\$/a $1" /etc/tt-serving/config.toml; }
model_key 'memory_max_mib = 1'
if systemctl reload $unit 2>"$out/reload-refused.txt"; then
    fail reload-refused "systemctl reload returned 0 for a config the daemon refuses (memory_max_mib = 1)"
else
    ok reload-refused "systemctl reload failed; journal: $(journal | grep -m1 -i 'refused\|memory_max_mib' | cut -c1-200)"
fi
check still-serving "after the refused reload: $(systemctl show -P ActiveState $unit), slot $(slot_field state)" \
    test "$(systemctl show -P ActiveState $unit)/$(slot_field state)" = active/ready

# --- a real OOM kill, told apart from an outside SIGKILL ------------------
# 64 MiB (the least the daemon accepts) with the worker's 512 MiB KV pool
# made resident at load (TTW_KV_PREFAULT): the kernel OOM-kills the worker
# at every start, the slot gives up after its two attempts, and the reload
# must fail.
cp /etc/tt-serving/config.good /etc/tt-serving/config.toml
model_key 'memory_max_mib = 64'
model_key 'env = { TTW_KV_PREFAULT = "1" }'
printf '[models.smollm2.restart]\nmax_attempts = 2\nbackoff_ms = 500\n' >>/etc/tt-serving/config.toml
if timed reload-oom systemctl reload $unit 2>"$out/reload-oom.txt"; then
    fail reload-oom "systemctl reload returned 0 though the new definition's slot was OOM-killed at every start"
else
    ok reload-oom "systemctl reload failed: the new definition's slot did not come up"
fi
events=$(cat $cgroot/slot-*/memory.events 2>/dev/null | tr '\n' ' ')
err=$(slot_field last_error)
check oom-reported "last_error: ${err:0:240}; memory.events: ${events:-no slot cgroup}" \
    sh -c "echo \"\$1\" | grep -q 'killed by the OOM killer'" _ "$err"
check oom-kernel "kernel: $(journalctl -k --no-pager -o cat | grep -m1 'Memory cgroup out of memory' | cut -c1-160)" \
    sh -c "journalctl -k --no-pager -o cat | grep -q 'Memory cgroup out of memory'"
check oom-journal "daemon journal: $(journal | grep -m1 'worker killed by the OOM killer' | cut -c1-200)" \
    sh -c "journalctl -u $unit --no-pager -o cat | grep -q 'worker killed by the OOM killer'"
oom_metric=$(metrics | grep -m1 'worker_restarts.*cause="oom"')
check oom-metric "metric: ${oom_metric:-no worker_restarts sample with cause=\"oom\"}" test -n "$oom_metric"
cp /etc/tt-serving/config.good /etc/tt-serving/config.toml
if systemctl reload $unit; then ok reload-restored "the good file reloads"; else fail reload-restored "the good file did not reload"; fi
slot_ready() { test "$(slot_field state)" = ready; }
wait_for 300 slot_ready
worker=$(slot_field worker_pid)
if [ -n "$worker" ] && kill -KILL "$worker"; then
    wait_for 60 sh -c "$bin/ttctl status --json | grep -q 'neither the daemon nor the OOM killer'"
    err=$(slot_field last_error)
    check sigkill-not-oom "last_error: ${err:0:240}" \
        sh -c "echo \"\$1\" | grep -q 'neither the daemon nor the OOM killer'" _ "$err"
else
    fail sigkill-not-oom "no worker pid in ttctl status"
fi

# The slot's memory after a restart counts the model's pages the new worker
# maps again (the slot's cgroup outlives its workers): memory.current is at
# least 3/4 of the worker's resident set. (Not all of it: pages of the
# tt-worker executable are charged to whoever read the file first, the cp
# above. With the slot's cgroup made anew per worker it was 23 MB of a
# 125 MB resident set; kept, 125 of 129 MB.)
wait_for 300 slot_ready
worker=$(slot_field worker_pid)
rss_kib=$(awk '/^VmRSS:/ {print $2}' /proc/"${worker:-0}"/status 2>/dev/null)
current=$(cat $cgroot/slot-smollm2/memory.current 2>/dev/null)
check memory-whole-after-restart "slot memory.current ${current:-?} B, the new worker's VmRSS ${rss_kib:-?} KiB" \
    test "$((${current:-0} * 4))" -ge "$((${rss_kib:-1} * 1024 * 3))"

# --- the watchdog: a stopped daemon is killed and replaced ----------------
old_main=$(systemctl show -P MainPID $unit)
old_worker=$(slot_field worker_pid)
restarts_before=$(systemctl show -P NRestarts $unit)
new_main() { local p; p=$(systemctl show -P MainPID $unit); [ "$p" != 0 ] && [ "$p" != "$old_main" ]; }
kill -STOP "$old_main"
if timed watchdog-replaced wait_for 200 new_main; then
    ok watchdog-replaced "MainPID $old_main -> $(systemctl show -P MainPID $unit), NRestarts $restarts_before -> $(systemctl show -P NRestarts $unit); $(journalctl -u $unit --no-pager -o cat | grep -m1 -i 'watchdog timeout' | cut -c1-120)"
else
    fail watchdog-replaced "MainPID still $(systemctl show -P MainPID $unit) 200 s after SIGSTOP"
fi
check watchdog-old-gone "old daemon $old_main and worker ${old_worker:-?}" \
    sh -c "! kill -0 $old_main 2>/dev/null && ! kill -0 ${old_worker:-0} 2>/dev/null"
timed watchdog-ready wait_for 300 slot_ready
check watchdog-ready "after the restart: $(systemctl show -P ActiveState $unit), slot $(slot_field state)" slot_ready
check watchdog-card-reset "the new daemon reset the card: $(journal | grep 'resetting cards' | tail -n 1 | cut -c1-120)" \
    test "$(journal | grep -c 'resetting cards')" -ge 2
left_cgroups=$(cd $cgroot && ls -d */ 2>/dev/null | tr '\n' ' ')
check watchdog-no-stale-cgroup "cgroups under the unit: $left_cgroups" test "$left_cgroups" = "daemon/ slot-smollm2/ "

# --- stop: clean, nothing left, IPC files kept ----------------------------
# A tt-umd lock file as the engines leave it in /dev/shm (owned by the
# service's user): RemoveIPC= would delete it at the stop.
runuser -u tt-serving -- sh -c 'echo > /dev/shm/TT_UMD_LOCK.CHIP_IN_USE_0_PCIe'
if timed stop systemctl stop $unit; then ok stop "systemctl stop returned 0"; else fail stop "systemctl stop failed"; fi
left=$(pgrep -u tt-serving -a | grep -v tt-fakehw || true)
check nothing-left "processes of tt-serving after the stop: ${left:-none}" test -z "$left"
check cgroup-gone "unit cgroup after the stop: $(ls -d $cgroot 2>/dev/null || echo gone)" test ! -d $cgroot
check ipc-kept "/dev/shm after the stop: $(ls /dev/shm | tr '\n' ' ')" test -f /dev/shm/TT_UMD_LOCK.CHIP_IN_USE_0_PCIe
check clean-record "the daemon recorded the clean stop in its StateDirectory: $(ls /var/lib/tt-serving | tr '\n' ' ')" \
    test -f /var/lib/tt-serving/clean-shutdown
check clean-exit "Result=$(systemctl show -P Result $unit); journal: $(journal | grep 'stopped cleanly' | tail -n 1 | cut -c1-120)" \
    test "$(systemctl show -P Result $unit)" = success
finish
