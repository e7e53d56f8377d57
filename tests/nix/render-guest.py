#!/usr/bin/env python3
"""Renders what module.nix gives tests/guest/host.nix (eval.nix's JSON on
stdin) into the files the systemd guest installs, the way NixOS writes them:

  tenstorrent-serving.service   the unit (systemd.services.tenstorrent-serving)
  config.toml                   /etc/tt-serving/config.toml
  tmpfiles.conf                 systemd.tmpfiles.rules
  sysusers.conf                 users.users and users.groups, for systemd-sysusers

  render-guest.py OUT_DIR

The package's store path becomes /usr/local/lib/tt-serving, where the guest
puts the built binaries; any other store path left is an error (the guest has
no /nix/store). Directives are written in NixOS's order (sorted by name), a
list as one line per element, booleans as true/false. Exits 1 with the reason
on anything it cannot render.
"""
import json
import re
import sys
from pathlib import Path

PACKAGE = re.compile(r"/nix/store/[0-9a-z]{32}-tt-serving-[^/\s\"]*")
PREFIX = "/usr/local/lib/tt-serving"
HEADER = "# Rendered from module.nix for tests/guest/host.nix by tests/nix/render-guest.py\n# (tests/nix/run.sh with NIXPKGS_LIB and TT_NIX_WRITE_GUEST=1); do not edit.\n"


def value(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, str)):
        return str(v)
    raise ValueError(f"cannot render {v!r} as a unit value")


def directives(attrs):
    lines = []
    for key in sorted(attrs):
        v = attrs[key]
        for item in v if isinstance(v, list) else [v]:
            lines.append(f"{key}={value(item)}")
    return lines


def unit_file(u):
    unit = {"Description": u["description"]}
    for key, nix in (("After", "after"), ("Wants", "wants"), ("Requires", "requires"), ("Before", "before")):
        if u.get(nix):
            unit[key] = " ".join(u[nix])
    unit.update(u.get("unitConfig", {}))
    service = dict(u["serviceConfig"])
    env = u.get("environment", {})
    if env:
        service["Environment"] = [f"{k}={env[k]}" for k in sorted(env)]
    if u.get("script") or u.get("path"):
        raise ValueError("the unit has script= or path=, which this renderer does not write")
    text = "[Unit]\n" + "\n".join(directives(unit)) + "\n\n[Service]\n" + "\n".join(directives(service)) + "\n"
    return text


def sysusers(users, groups):
    lines = [f"g {name} -" for name in sorted(groups)]
    for name in sorted(users):
        u = users[name]
        if not u.get("isSystemUser"):
            raise ValueError(f"user {name} is not a system user")
        desc = u.get("description", "-")
        # "-": a free system uid, and the group of the user's own name;
        # "-:GROUP" when the module gives it another group.
        ident = "-" if u["group"] == name else f'-:{u["group"]}'
        lines.append(f'u {name} {ident} "{desc}" {u.get("home", "-")}')
    return "\n".join(lines) + "\n"


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    out = Path(sys.argv[1])
    d = json.load(sys.stdin)
    if d.get("failedAssertions"):
        sys.exit(f"render-guest: the host fails module assertions: {d['failedAssertions']}")
    files = {
        "tenstorrent-serving.service": unit_file(d["unit"]),
        "config.toml": d["toml"].lstrip("\n"),
        "tmpfiles.conf": "\n".join(d["tmpfiles"]) + "\n",
        "sysusers.conf": sysusers(d["users"], d["groups"]),
    }
    out.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        text = PACKAGE.sub(PREFIX, text)
        left = re.findall(r"/nix/store/\S+", text)
        if left:
            sys.exit(f"render-guest: {name} still names store paths the guest lacks: {left}")
        comment = "".join("# " + l[2:] + "\n" if l.startswith("# ") else l + "\n" for l in HEADER.splitlines())
        (out / name).write_text(comment + text)
        print(f"render-guest: wrote {out / name}")


if __name__ == "__main__":
    try:
        main()
    except ValueError as e:
        sys.exit(f"render-guest: {e}")
