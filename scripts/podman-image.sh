#!/usr/bin/env bash
# Build the container image the container-mode tests run (tests/container.rs)
# with rootful podman, from a local root and no registry (none is reachable
# from CI): Debian's static busybox in /bin, /lib and /lib64 pointing into
# /usr (the tests bind the host's /usr read-only, so the host's python3 runs
# the vLLM stand-in inside), root and nobody in /etc/passwd. Its entrypoint
# is /bin/false, as an image whose own launcher cannot start a slot's engine
# (tt-inference-server's exits without --tt-device): the recipe gives
# --entrypoint, which the tests check podman ran.
#
# Prints the image's name. Idempotent: an image of that name is reused
# (building one takes under a second). Needs: root, podman, busybox-static
# (.ci/run installs them: apt-get install podman runc busybox-static).
set -euo pipefail

IMAGE="${TT_PODMAN_IMAGE:-localhost/tt-serving-test:busybox}"
BUSYBOX="${BUSYBOX:-/bin/busybox}"

if podman image exists "$IMAGE" 2>/dev/null; then
    echo "$IMAGE"
    exit 0
fi
if ! "$BUSYBOX" --list >/dev/null 2>&1; then
    echo "podman-image.sh: no static busybox at $BUSYBOX; apt-get install busybox-static" >&2
    exit 1
fi
root="$(mktemp -d)"
trap 'rm -rf "$root"' EXIT
mkdir -p "$root"/{bin,usr,etc,dev,proc,sys,tmp,run,root,var/tmp}
chmod 1777 "$root/tmp" "$root/var/tmp"
cp "$BUSYBOX" "$root/bin/busybox"
for applet in $("$BUSYBOX" --list); do
    [ "$applet" = busybox ] || ln -s busybox "$root/bin/$applet"
done
# The host's /usr is bound in: its dynamic loader and libraries are found
# through the usual /lib and /lib64 paths.
ln -s usr/lib "$root/lib"
ln -s usr/lib64 "$root/lib64"
printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n' >"$root/etc/passwd"
printf 'root:x:0:\nnogroup:x:65534:\n' >"$root/etc/group"
if ! tar --numeric-owner --owner=0 --group=0 -C "$root" -cf - . |
    podman import --change 'ENTRYPOINT ["/bin/false"]' --change 'CMD []' - "$IMAGE" \
        >/dev/null 2>"$root.err"; then
    cat "$root.err" >&2
    rm -f "$root.err"
    exit 1
fi
rm -f "$root.err"
echo "$IMAGE"
