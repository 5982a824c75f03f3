"""Renders packaging/conda/recipe.yaml with variants.yaml through rattler-build's own renderer (py-rattler-build,
from PyPI) and checks what conda would build: a libzero per MPI variant, named in its build string, and a
libzero-engine per MPI variant and Python, pinned to the libzero of its MPI variant."""

import sys

import rattler_build as rb

recipe_path, variants_path = sys.argv[1:3]
rendered = rb.Stage0Recipe.from_file(recipe_path).render(rb.VariantConfig.from_file(variants_path), rb.RenderConfig())
builds: dict[str, dict[str, dict]] = {"libzero": {}, "libzero-engine": {}}
for variant in rendered:
    stage1 = variant.recipe
    builds[stage1.package.name][stage1.build.string] = dict(variant.variant)

variants = rb.VariantConfig.from_file(variants_path)
mpis, pythons = variants.get_values("mpi"), variants.get_values("python")
prefix = {mpi: "nompi" if mpi == "nompi" else f"mpi_{mpi}" for mpi in mpis}
library = {v["mpi"]: string for string, v in builds["libzero"].items()}
assert sorted(library) == sorted(mpis), builds["libzero"]
for mpi, string in library.items():
    assert string.startswith(prefix[mpi] + "_h"), string
assert len(builds["libzero-engine"]) == len(mpis) * len(pythons), sorted(builds["libzero-engine"])
for string, v in builds["libzero-engine"].items():
    python = v["python"].replace(".", "")
    assert string.startswith(f"{prefix[v['mpi']]}_py{python}h"), string
    assert v["libzero"].endswith(library[v["mpi"]]), (string, v["libzero"], library)
print(f"rattler-build {rb.rattler_build_version()} renders {len(library)} libzero builds "
      f"({', '.join(sorted(library.values()))}) and {len(builds['libzero-engine'])} libzero-engine builds")
