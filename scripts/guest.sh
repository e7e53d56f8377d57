#!/usr/bin/env bash
# A systemd guest for the tests that run the daemon's unit under real
# systemd (tests/systemd_guest.rs): a minimal Debian root with systemd, a
# kernel and its initrd, booted by qemu.
#
#   scripts/guest.sh [--suite SUITE]
#       Build the guest once (debootstrap from the Debian mirror this
#       machine's apt is configured with, or TT_GUEST_MIRROR; about 3 min
#       and 1 GB of disk) and print its directory. SUITE: bookworm (Debian
#       12, systemd 252, the default) or trixie (Debian 13, systemd 257).
#       A complete guest is reused without touching the network.
#   scripts/guest.sh [--suite SUITE] boot SHARE [TIMEOUT_SECS]
#       Boot it with SHARE (a host directory) mounted at /mnt/host; the
#       guest runs SHARE/scenario.sh as root once it is up, its output to
#       SHARE/out/scenario.log, then powers off. The serial console goes to
#       SHARE/out/console.log. Exits 0 when the guest powered off by itself
#       after the scenario, 124 when it ran past TIMEOUT_SECS (default 900)
#       and was killed.
#
# The guest has no network device: the share and the serial console are its
# only ways out. Its disk is opened with snapshot=on, so every boot starts
# from the built image and nothing a scenario does persists.
#
# Accelerator: TCG (software emulation) unless TT_GUEST_ACCEL=kvm; this
# project's machines expose a /dev/kvm that stock guest kernels stall on.
# Destination: ${TT_GUEST_DIR:-$HOME/.cache/tt-serving/guest-SUITE}.
set -euo pipefail

SUITE=bookworm
if [[ "${1:-}" == "--suite" ]]; then
    SUITE="${2:?--suite needs bookworm or trixie}"
    shift 2
fi
case "${SUITE}" in
bookworm | trixie) ;;
*)
    echo "guest: unknown suite '${SUITE}'; use bookworm (systemd 252) or trixie (systemd 257)" >&2
    exit 2
    ;;
esac
DIR="${TT_GUEST_DIR:-${HOME}/.cache/tt-serving/guest-${SUITE}}"
# The mirror this machine's apt already uses for Debian's main archive (a
# deb822 `URIs:` line, or a one-line `deb URI SUITE main`), never a host
# written here: the machine's configuration knows which one it can reach.
apt_mirror() {
    local f
    for f in /etc/apt/sources.list.d/*.sources /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
        [[ -r "${f}" ]] || continue
        awk '
            /^[[:space:]]*#/ { next }
            /^URIs:/ { for (i = 2; i <= NF; i++) if ($i !~ /security/) { print $i; exit } }
            /^deb[[:space:]]/ { for (i = 2; i <= NF; i++) if ($i ~ /^[a-z+]+:\/\//) { if ($i !~ /security/) { print $i; exit } } }
        ' "${f}"
    done | head -n 1
}
MIRROR="${TT_GUEST_MIRROR:-$(apt_mirror)}"
if [[ -z "${MIRROR}" ]]; then
    echo "guest: no Debian mirror in /etc/apt/sources.list{,.d/}; set TT_GUEST_MIRROR to one" >&2
    exit 1
fi
# Bump when the image's contents change, so cached guests are rebuilt.
LAYOUT=2

need() {
    command -v "$1" >/dev/null || {
        echo "guest: $1 not found; install $2 (apt-get install -y $2)" >&2
        exit 1
    }
}

# DIR MARK: fails unless DIR is absent or holds MARK (this script's own).
mine() {
    if [[ -e "$1" && ! -e "$1/$2" ]]; then
        echo "guest: $1 exists and is not a guest this script built (no $2 in it); refusing to replace it. Point TT_GUEST_DIR at a new directory, or remove it yourself" >&2
        exit 1
    fi
}

build() {
    local work="${DIR}.partial"
    # Only ever delete what this script made: a guest carries `layout`,
    # a build in progress `.tt-guest-partial`. Anything else at those paths
    # (a mistyped TT_GUEST_DIR) is refused, never removed.
    mine "${DIR}" layout
    mine "${work}" .tt-guest-partial
    need debootstrap debootstrap
    need mkfs.ext4 e2fsprogs
    [[ "$(id -u)" == 0 ]] || {
        echo "guest: building the guest root needs root (debootstrap, chroot)" >&2
        exit 1
    }
    rm -rf "${work}"
    mkdir -p "${work}"
    : >"${work}/.tt-guest-partial"
    local root="${work}/root"
    local started=${SECONDS}
    echo "guest: debootstrap ${SUITE} from ${MIRROR} into ${root}" >&2
    # minbase: required packages only (apt, passwd, util-linux, ...); then
    # systemd as PID 1, udev for devices, the kernel with its initrd.
    debootstrap --variant=minbase \
        --include=systemd,systemd-sysv,udev,dbus,kmod,procps,jq,linux-image-amd64,initramfs-tools \
        "${SUITE}" "${root}" "${MIRROR}" >"${work}/debootstrap.log" 2>&1 || {
        echo "guest: debootstrap failed; the end of ${work}/debootstrap.log:" >&2
        tail -n 20 "${work}/debootstrap.log" >&2
        exit 1
    }
    echo "guest: debootstrap took $((SECONDS - started)) s" >&2

    echo "tt-guest" >"${root}/etc/hostname"
    cat >"${root}/etc/fstab" <<'EOF'
/dev/vda / ext4 rw,relatime 0 1
host /mnt/host 9p trans=virtio,version=9p2000.L,msize=1048576,cache=none 0 0
EOF
    mkdir -p "${root}/mnt/host"
    # The scenario: run once the system is up, then power off whatever it
    # returns (the host reads the result from the share).
    cat >"${root}/etc/systemd/system/tt-guest-scenario.service" <<'EOF'
[Unit]
Description=tt-serving guest scenario (SHARE/scenario.sh from the host)
Requires=mnt-host.mount
After=mnt-host.mount multi-user.target
SuccessAction=poweroff-force
FailureAction=poweroff-force

[Service]
Type=oneshot
TimeoutStartSec=infinity
ExecStart=/bin/sh -c 'mkdir -p /mnt/host/out && exec /bin/bash /mnt/host/scenario.sh >/mnt/host/out/scenario.log 2>&1'
EOF
    ln -sf /etc/systemd/system/tt-guest-scenario.service \
        "${root}/etc/systemd/system/multi-user.target.wants/tt-guest-scenario.service"
    # Nothing in the guest waits on time, the network or a login.
    for unit in apt-daily.timer apt-daily-upgrade.timer e2scrub_all.timer fstrim.timer \
        systemd-timesyncd.service getty@tty1.service; do
        ln -sf /dev/null "${root}/etc/systemd/system/${unit}"
    done
    # The journal kept in memory only: the scenario copies what it needs.
    mkdir -p "${root}/etc/systemd/journald.conf.d"
    printf '[Journal]\nStorage=volatile\n' >"${root}/etc/systemd/journald.conf.d/volatile.conf"
    # Smaller image: no package lists, docs or locales.
    rm -rf "${root}"/var/lib/apt/lists/* "${root}"/var/cache/apt/*.bin "${root}"/var/cache/apt/archives/*.deb \
        "${root}"/usr/share/doc/* "${root}"/usr/share/man/* "${root}"/usr/share/locale/*

    local kernel initrd
    kernel="$(ls "${root}"/boot/vmlinuz-* | sort -V | tail -n 1)"
    initrd="$(ls "${root}"/boot/initrd.img-* | sort -V | tail -n 1)"
    [[ -f "${kernel}" && -f "${initrd}" ]] || {
        echo "guest: no kernel or initrd under ${root}/boot" >&2
        exit 1
    }
    cp "${kernel}" "${work}/vmlinuz"
    cp "${initrd}" "${work}/initrd.img"
    chroot "${root}" dpkg-query -W -f='${Version}\n' systemd >"${work}/systemd-version"
    # An ext4 image made from the directory (mke2fs -d): no loop device or
    # mount needed. Sparse; 3 GiB leaves the scenario room for caches.
    truncate -s 3G "${work}/disk.img"
    mkfs.ext4 -q -F -L tt-guest -d "${root}" "${work}/disk.img"
    rm -rf "${root}"
    echo "${LAYOUT}" >"${work}/layout"
    rm -f "${work}/.tt-guest-partial"
    rm -rf "${DIR}"
    mv "${work}" "${DIR}"
    echo "guest: built ${DIR} (systemd $(cat "${DIR}/systemd-version")) in $((SECONDS - started)) s" >&2
}

ready() {
    [[ -f "${DIR}/disk.img" && -f "${DIR}/vmlinuz" && -f "${DIR}/initrd.img" ]] &&
        [[ "$(cat "${DIR}/layout" 2>/dev/null)" == "${LAYOUT}" ]]
}

boot() {
    local share="${1:?boot needs the share directory}"
    local limit="${2:-900}"
    need qemu-system-x86_64 qemu-system-x86
    [[ -f "${share}/scenario.sh" ]] || {
        echo "guest: ${share}/scenario.sh does not exist; the guest runs it once it is up" >&2
        exit 2
    }
    mkdir -p "${share}/out"
    local accel="${TT_GUEST_ACCEL:-tcg}"
    local cpu=max
    [[ "${accel}" == kvm ]] && cpu=host
    local started=${SECONDS}
    local rc=0
    # systemd.unified_cgroup_hierarchy=1: cgroup v2 only, as NixOS runs.
    timeout --kill-after=10 "${limit}" qemu-system-x86_64 \
        -accel "${accel}" -cpu "${cpu}" -smp 2 -m 2048 \
        -nographic -no-reboot -nic none -monitor none \
        -serial "file:${share}/out/console.log" \
        -kernel "${DIR}/vmlinuz" -initrd "${DIR}/initrd.img" \
        -append "root=/dev/vda rw console=ttyS0 systemd.unified_cgroup_hierarchy=1 systemd.show_status=0 panic=-1" \
        -drive "file=${DIR}/disk.img,format=raw,if=virtio,snapshot=on" \
        -virtfs "local,path=${share},mount_tag=host,security_model=none,id=host" \
        </dev/null >"${share}/out/qemu.log" 2>&1 || rc=$?
    echo "guest: $(cat "${DIR}/systemd-version" 2>/dev/null || echo "${SUITE}") guest ran $((SECONDS - started)) s (qemu exit ${rc})" >&2
    return "${rc}"
}

if ! ready; then
    build
fi
case "${1:-}" in
"") echo "${DIR}" ;;
boot)
    shift
    boot "$@"
    ;;
*)
    echo "guest: unknown command '$1'; use no command (build, print the directory) or 'boot SHARE [TIMEOUT_SECS]'" >&2
    exit 2
    ;;
esac
