#!/usr/bin/env python3
"""Take and release tt-umd's real chip lock, with no card.

Run with the python of the venv that scripts/ttnn.sh makes (tt-umd 0.9.14
from PyPI): `$TT_TTNN_PYTHON tests/engines/umd_lock.py N [--try]`.

It uses tt-umd's own binding `tt_umd.RobustMutex("CHIP_IN_USE_<N>_PCIe")`,
the shared-memory half of the lock every tt-umd LocalChip takes while it
uses card N (`/dev/tenstorrent/N`) from `start_device` to `close_device`:
the file `/dev/shm/TT_UMD_LOCK.CHIP_IN_USE_<N>_PCIe` (tt-umd
lock_manager.cpp get_mutex_name, robust_mutex.cpp open_shm_file). tt-umd
0.9.14 takes, for a PCIe chip, that file's mutex first and then a KMD
resource lock (index 20 on /dev/tenstorrent/N; lock_manager.cpp
CompositeMutex, MUTEX_TYPE_TO_KMD_LOCK_INDEX); this script takes only the
file half, which is the whole lock for tt-umd releases before the KMD one
and the half anyone without a card can take. See docs/HARDWARE.md.

The file is opened with shm_open, so its directory is always /dev/shm:
tests run this in a private mount namespace with a tmpfs there
(`unshare -m` and `mount -t tmpfs`).

Protocol, one line each way:
- when the lock is held it prints `held <pid> <tid>` (the TID is the
  holding thread's, the one tt-umd records at bytes 48..51 of the file and
  the kernel at bytes 0..3 and 8..11);
- `release` on stdin: unlocks, prints `released`, and keeps the file mapped
  (as a tt-umd process that closed its device but lives on);
- `take` on stdin: takes it again (blocking), prints `held <pid> <tid>`;
- `exit` or end of input: releases it if held and exits 0.
With `--try` the first take does not wait: if another process holds the
lock it prints `busy <pid> <tid>` (the holder tt-umd recorded) and exits 1.
A holder that dies without releasing (kill -9) leaves the lock to be
recovered by the next taker (EOWNERDEAD, pthread_mutex_consistent), which
tt-umd does silently.

tt-umd's own warnings (`Waiting for lock ... which is currently held by
thread TID: T, PID: P`, after 1 s of waiting) go to stdout too, as its log
lines do, so readers should look for the lines above by their first word.
"""

import os
import sys
import threading

import tt_umd


def main():
    args = sys.argv[1:]
    try_only = "--try" in args
    args = [a for a in args if a != "--try"]
    if len(args) != 1 or not args[0].isdigit():
        print("usage: umd_lock.py N [--try]", file=sys.stderr)
        return 2
    name = f"CHIP_IN_USE_{int(args[0])}_PCIe"
    # The constructor creates (mode 0666) or opens the file, sizes it and
    # maps it; it does not take the lock.
    mutex = tt_umd.RobustMutex(name)
    pid, tid = os.getpid(), threading.get_native_id()

    if try_only:
        owner = mutex.probe_lock(0)
        if owner is not None:
            print(f"busy {owner[0]} {owner[1]}", flush=True)
            return 1
    else:
        mutex.lock()
    held = True
    print(f"held {pid} {tid}", flush=True)

    for line in sys.stdin:
        word = line.strip()
        if word == "release" and held:
            mutex.unlock()
            held = False
            print("released", flush=True)
        elif word == "take" and not held:
            mutex.lock()
            held = True
            print(f"held {pid} {tid}", flush=True)
        elif word == "exit":
            break
    if held:
        mutex.unlock()
    return 0


if __name__ == "__main__":
    sys.exit(main())
