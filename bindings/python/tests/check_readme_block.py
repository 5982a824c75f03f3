"""Checks that the code block README.md shows after a marker line stands, line for line and in order (blank lines
aside), in the example that runs it:
    python check_readme_block.py README.md "MARKER" examples/python/EXAMPLE.py"""

import sys

readme, marker, example = sys.argv[1:4]
lines = open(readme, encoding="utf-8").read().splitlines()
start = next(i for i, line in enumerate(lines) if marker in line)
begin = next(i for i in range(start, len(lines)) if lines[i].startswith("```python")) + 1
end = next(i for i in range(begin, len(lines)) if lines[i].startswith("```"))
block = [line for line in lines[begin:end] if line.strip()]
source = [line for line in open(example, encoding="utf-8").read().splitlines() if line.strip()]
found = any(source[i : i + len(block)] == block for i in range(len(source) - len(block) + 1))
if not block or not found:
    missing = [line for line in block if line not in source]
    sys.exit(f"README.md's block after '{marker}' is not in {example} as it is, in order; lines it lacks:\n"
             + "\n".join(missing))
print(f"README.md's {len(block)} lines after '{marker}' are {example}'s")
