#!/usr/bin/env bash
# README.md's Java and Go quick starts are examples/java/QuickStart.java and examples/go/quickstart/main.go,
# character for character (the files are what the tests run).
set -euo pipefail
root=$1
python3 - "$root" <<'PY'
import re, sys, pathlib
root = pathlib.Path(sys.argv[1])
readme = (root / "README.md").read_text()
for lang, path in (("java", "examples/java/QuickStart.java"), ("go", "examples/go/quickstart/main.go")):
    blocks = re.findall(rf"```{lang}\n(.*?)```", readme, re.S)
    if (root / path).read_text() not in blocks:
        sys.exit(f"README.md's {lang} quick start differs from {path}")
print("README quick starts match their files")
PY
