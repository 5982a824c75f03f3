"""Reads an abidiff report on stdin; exits 0 when every changed function changed only because structs it takes grew
at their end (new fields after every old one: the append rule of docs/abi.md, safe because each such struct leads
with struct_size and the library reads only the bytes a caller's struct_size says it has), 1 otherwise, naming the
first line that is something else. A report without changed functions passes."""

import re
import sys

# The lines abidiff writes around a struct's growth, besides the growth itself.
FRAME = [
    r"\d+ functions? with some indirect sub-type changes?:",
    r"\[C\] 'function .*' has some indirect sub-type changes:",
    r"parameter \d+ of type '.*' has sub-type changes:",
    r"in pointed to type '.*':",
    r"in unqualified underlying type '.*':",
    r"underlying type 'struct \w+' changed:",
    r"type size changed from \d+ to \d+ \(in bits\)",
    r"\d+ data member insertions?:",
    r"'[^']+', at offset \d+ \(in bits\)",
    # Members whose types changed only harmlessly, which abidiff itself filtered out (a callback taking a pointer
    # to a struct that grew at its end).
    r"no data member changes \(\d+ filtered\);",
]


def main() -> int:
    lines = sys.stdin.read().splitlines()
    try:
        start = next(i for i, line in enumerate(lines) if re.match(r"\d+ functions? with some indirect", line.strip()))
    except StopIteration:
        return 0
    old_size = None
    for line in lines[start:]:
        text = line.strip()
        if not text:
            continue
        if text.startswith("Variables changes summary") or re.match(r"\d+ (Added|Removed) function", text):
            break
        if not any(re.fullmatch(p, text) for p in FRAME):
            print(f"not a struct growing at its end: {text}")
            return 1
        size = re.fullmatch(r"type size changed from (\d+) to (\d+) \(in bits\)", text)
        if size:
            old_size = int(size.group(1))
            if int(size.group(2)) <= old_size:
                print(f"a struct shrank: {text}")
                return 1
        offset = re.fullmatch(r"'[^']+', at offset (\d+) \(in bits\)", text)
        if offset and (old_size is None or int(offset.group(1)) < old_size):
            print(f"a field inserted before a struct's end: {text}")
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
