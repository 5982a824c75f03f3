"""docs/checkpoint-format.md's example manifest against one the library wrote: the same keys at every level, the
same format version, and the library version that writes that format.

    python3 check_manifest_doc.py DOC.md CHECKPOINT_DIR LIBRARY_VERSION
"""
import json
import re
import sys


def example_manifest(doc_path):
    text = open(doc_path, encoding="utf-8").read()
    block = re.search(r"## manifest\.json\s*```json\n(.*?)```", text, re.S)
    if block is None:
        sys.exit(f"{doc_path}: no ```json block under '## manifest.json'")
    body = re.sub(r"//[^\n]*", "", block.group(1))  # the page's comments
    body = re.sub(r",\s*\.\.\.\s*\]", "]", body)  # "[first, ...]": the first element stands for all
    return json.loads(body)


def compare_keys(doc, real, where, problems):
    if isinstance(real, dict):
        if not isinstance(doc, dict):
            problems.append(f"{where}: an object in the files, not in the page")
            return
        for key in sorted(set(real) - set(doc)):
            problems.append(f"{where}.{key}: written by the library, missing from the page")
        for key in sorted(set(doc) - set(real)):
            problems.append(f"{where}.{key}: on the page, never written")
        for key in set(doc) & set(real):
            compare_keys(doc[key], real[key], f"{where}.{key}", problems)
    elif isinstance(real, list) and real and isinstance(real[0], dict):
        if not isinstance(doc, list) or not doc:
            problems.append(f"{where}: a list of objects in the files, not on the page")
            return
        compare_keys(doc[0], real[0], f"{where}[0]", problems)


def main():
    doc_path, checkpoint, version = sys.argv[1:4]
    doc = example_manifest(doc_path)
    real = json.load(open(f"{checkpoint}/manifest.json", encoding="utf-8"))
    problems = []
    compare_keys(doc, real, "manifest", problems)
    for key, want in (("format", real["format"]), ("format_version", real["format_version"]),
                      ("library_version", version)):
        if doc.get(key) != want:
            problems.append(f"manifest.{key}: the page shows {doc.get(key)!r}, this library writes {want!r}")
    if problems:
        sys.exit(f"{doc_path} disagrees with {checkpoint}/manifest.json:\n  " + "\n  ".join(problems))
    print(f"{doc_path}: the example manifest has every key the library writes, format version "
          f"{real['format_version']}, library {version}")


main()
