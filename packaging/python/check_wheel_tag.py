"""Reads `auditwheel show --json` of a repaired wheel on stdin: the wheel is tagged with the intended manylinux tag
(argv[1]), its own symbol versions allow it (that tag or an older glibc's), and nothing lies outside the wheel and the policy's libraries but what repair excluded
(argv[2:]). Run with only the C and C++ runtimes on auditwheel's library path, so that the excluded libraries are
not judged by their own dependencies (which `overall_tag` would then count)."""

from __future__ import annotations

import json
import re
import sys

def glibc(tag: str) -> tuple[int, int]:
    """manylinux_2_31_x86_64 -> (2, 31)."""
    major, minor = re.fullmatch(r"manylinux_(\d+)_(\d+)_\w+", tag).groups()
    return int(major), int(minor)


show = json.load(sys.stdin)
tag, excluded = sys.argv[1], set(sys.argv[2:])
outside = sorted(show["external_libs"])
print(f"{show['wheel']}: symbols allow {show['sym_tag']}; outside the wheel: {', '.join(outside) or 'nothing'}")
if not show["sym_tag"].startswith("manylinux_") or glibc(show["sym_tag"]) > glibc(tag):
    sys.exit(f"expected the symbols to allow {tag} (or an older glibc)")
if not show["wheel"].endswith(f"-{tag}.whl"):
    sys.exit(f"expected the wheel to be tagged {tag}")
if set(outside) != excluded:
    sys.exit(f"expected exactly {sorted(excluded)} outside the wheel")
