"""Units: the params stage 3 gathers and releases together. By default each element of the outermost
``torch.nn.ModuleList``s is a unit and the other params form one unit each side of them (before the first block, after
the last), numbered in registration order; ``units=fn(name, param) -> key`` groups params by any key instead."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence

import torch


def default_units(model: torch.nn.Module) -> Callable[[str, torch.nn.Parameter], Hashable]:
    """Each element of a ModuleList is a unit (the outermost list: a list inside a block stays in that block); the
    params before the first block and after the last form one unit each."""
    blocks: list[str] = []
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.ModuleList) and not any(name.startswith(b + ".") for b in blocks):
            blocks.extend(f"{name}.{child}" if name else child for child, _ in module.named_children())

    def unit_of(name: str, _param: torch.nn.Parameter) -> Hashable:
        for b in blocks:
            if name.startswith(b + "."):
                return ("block", b)
        return ("rest", None)

    return unit_of


def number_units(
    named: Sequence[tuple[str, torch.nn.Parameter]], unit_of: Callable[[str, torch.nn.Parameter], Hashable]
) -> list[int]:
    """Each param's unit, numbered by first appearance in registration order."""
    keys: dict[Hashable, int] = {}
    numbers = []
    for name, p in named:
        key = unit_of(name, p)
        if key == ("rest", None):
            # The params outside every block: one unit before the first block, one after the last.
            key = ("rest", "after" if any(k[0] == "block" for k in keys if isinstance(k, tuple)) else "before")
        keys.setdefault(key, len(keys))
        numbers.append(keys[key])
    return numbers
