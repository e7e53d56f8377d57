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
finish() {
    journalctl --no-pager -o short-monotonic >"$out/journal.txt" 2>&1
    echo done >>"$out/results"
    exit 0
}

echo "systemd: $(systemctl --version | head -n 1)" >"$out/versions"
uname -r >>"$out/versions"

# --- the host as the module sets it up ------------------------------------
mkdir -p $bin /srv/models /etc/tt-serving /etc/systemd/system/$unit.d
cp $share/bin/* $bin/ && chmod 0755 $bin/*
cp $share/model.gguf /srv/models/smollm2.gguf && chmod 0644 /srv/models/smollm2.gguf
useradd --system --user-group --home-dir /var/lib/tt-serving --shell /usr/sbin/nologin tt-serving
# The module's tmpfiles rules: the lock dir and tt-umd's listener dir.
printf 'd /run/lock/tenstorrent 0755 tt-serving tt-serving - -\nd /tmp/tt_umd_listeners 1777 root root - -\n' \
    >/etc/tmpfiles.d/tt-serving.conf
systemd-tmpfiles --create /etc/tmpfiles.d/tt-serving.conf
cp $share/tenstorrent-serving.service /etc/systemd/system/$unit
cp $share/config.toml /etc/tt-serving/config.toml
# Fake cards (no Tenstorrent card in a guest): the fake root is the one
# addition to the unit, writable because the fake tt-smi records resets
# in it. The module's ProtectControlGroups= for this systemd.
"$bin/tt-fakehw" create --root /var/lib/tt-fakehw --cards 1 --tt-fakehw-bin "$bin/tt-fakehw" >/dev/null
chown -R tt-serving:tt-serving /var/lib/tt-fakehw
"$bin/tt-fakehw" firmware --root /var/lib/tt-fakehw --detach >/dev/null
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
check status-progress "STATUS lines during start: $(journal | grep -c 'resetting\|starting') lines" \
    test -n "$status_text"
check delegate "slot cgroup $(ls -d $cgroot/slot-* 2>/dev/null | tr '\n' ' ') memory.current $(cat $cgroot/slot-*/memory.current 2>/dev/null)" \
    sh -c "test -d $cgroot/daemon && ls -d $cgroot/slot-* >/dev/null 2>&1 && test \"\$(cat $cgroot/slot-*/memory.current)\" -gt 0"
mem=$(slot_field worker_rss_bytes)
check memory-accounted "ttctl status worker_rss_bytes=$mem" test "${mem:-0}" -gt 0
warn=$(journal | grep -c 'cannot give the lock file' || true)
check no-lock-warning "'cannot give the lock file' lines: $warn" test "$warn" = 0

# --- reload: unchanged, refused, restored ---------------------------------
if timed reload-unchanged systemctl reload $unit; then
    ok reload-unchanged "systemctl reload of the same file returned 0"
else
    fail reload-unchanged "returned non-zero: $(journal | tail -n 3 | tr '\n' ' ')"
fi
cp /etc/tt-serving/config.toml /etc/tt-serving/config.good
sed -i 's/^# memory_max_mib$/memory_max_mib = 1/' /etc/tt-serving/config.toml
if systemctl reload $unit 2>"$out/reload-refused.txt"; then
    fail reload-refused "systemctl reload returned 0 for a config the daemon refuses (memory_max_mib = 1)"
else
    ok reload-refused "systemctl reload failed; journal: $(journal | grep -m1 -i 'refused\|memory_max_mib' | cut -c1-200)"
fi
check still-serving "after the refused reload: $(systemctl show -P ActiveState $unit), slot $(slot_field state)" \
    test "$(systemctl show -P ActiveState $unit)/$(slot_field state)" = active/ready

# --- a real OOM kill, told apart from an outside SIGKILL ------------------
# 64 MiB (the least the daemon accepts) is below what the model's worker
# needs.
cp /etc/tt-serving/config.good /etc/tt-serving/config.toml
sed -i 's/^# memory_max_mib$/memory_max_mib = 64/' /etc/tt-serving/config.toml
if timed reload-oom systemctl reload $unit 2>"$out/reload-oom.txt"; then
    fail reload-oom "systemctl reload returned 0 though the new definition's slot was OOM-killed"
else
    ok reload-oom "systemctl reload failed for a slot that does not come up"
fi
events=$(cat $cgroot/slot-*/memory.events 2>/dev/null | tr '\n' ' ')
err=$(slot_field last_error)
check oom-reported "last_error: ${err:0:240}; memory.events: $events" \
    sh -c "echo \"\$1\" | grep -q 'killed by the OOM killer'" _ "$err"
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

# --- stop: clean, nothing left, IPC files kept ----------------------------
# A tt-umd lock file as the engines leave it in /dev/shm (owned by the
# service's user): RemoveIPC= would delete it at the stop.
runuser -u tt-serving -- sh -c 'echo > /dev/shm/TT_UMD_LOCK.CHIP_IN_USE_0_PCIe'
if timed stop systemctl stop $unit; then ok stop "systemctl stop returned 0"; else fail stop "systemctl stop failed"; fi
left=$(pgrep -u tt-serving -a | grep -v tt-fakehw || true)
check nothing-left "processes of tt-serving after the stop: ${left:-none}" test -z "$left"
check cgroup-gone "unit cgroup after the stop: $(ls -d $cgroot 2>/dev/null || echo gone)" test ! -d $cgroot
check ipc-kept "/dev/shm after the stop: $(ls /dev/shm | tr '\n' ' ')" test -f /dev/shm/TT_UMD_LOCK.CHIP_IN_USE_0_PCIe
check clean-exit "journal: $(journal | grep -m1 'clean' | cut -c1-160)" \
    test "$(systemctl show -P Result $unit)" = success
finish
