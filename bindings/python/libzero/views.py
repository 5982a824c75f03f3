"""Zero-copy numpy views of engine memory that refuse to be used once the memory is no longer theirs.

A stage-3 unit's gathered buffer goes back to the engine's pool at ``release`` and may hold another unit's weights
after the next ``gather``; a gradient buffer at stages 2-3 is a bucket the engine reduces and reuses after
``grad_ready``. A plain array kept across those points would read or write someone else's numbers without a word.
:class:`View` is an ``ndarray`` subclass that checks its lease before every operation that touches the data
(indexing, ufuncs and operators, numpy functions, DLPack export, printing, copying) and raises
:class:`~libzero.errors.StaleViewError` instead.

What it cannot guard: whatever reaches the memory without asking the view. ``np.asarray(view)``,
``view.numpy()``, ``view.view(np.ndarray)`` and consumers of the buffer protocol (``memoryview``,
``np.frombuffer``, ``torch.as_tensor``, ``torch.tensor``) get an ordinary array or buffer over the same memory,
with no further checks; use them only while the view is valid. Views keep the engine alive, so memory the engine
holds for its whole life (stages 0-2 params, every shard) stays allocated while any array over it exists; but
pooled memory changes hands while the engine lives: a stage-3 unit's gathered buffer serves another unit after
``release``, and gradient buckets (stages 2-3) are reused or freed after the micro-step. A plain array kept past
its view's validity may then read other values or freed memory.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import _native
from ._dtypes import BF16, CODES, NUMPY
from .errors import InvalidArgumentError, InvalidStateError, StaleViewError


class _Lease:
    """What a view is allowed to see: a param's values while its unit stays gathered in one generation, or a
    param's gradient buffer until the param is declared ready (or the micro-step ends)."""

    __slots__ = ("engine", "native", "param", "unit", "generation", "grad_epoch", "zero_dtype", "what", "__weakref__")

    def __init__(self, engine: Any, param: int, what: str) -> None:
        self.engine = engine
        self.native = engine._n  # keeps the C engine (and its memory) alive while any array uses it
        self.param = param
        self.what = what
        self.unit = -1
        self.generation = 0
        self.grad_epoch: tuple[int, int] | None = None
        self.zero_dtype = 0

    def check(self) -> None:
        if self.engine._native is None:
            raise StaleViewError(f"this view of {self._name()} outlived engine.close()")
        if self.grad_epoch is not None:
            if self.engine._grad_epoch(self.param) != self.grad_epoch:
                raise StaleViewError(
                    f"this view of {self._name()}'s gradient was taken before grad_ready() (or the end of the "
                    "micro-step): its buffer now belongs to the reduction; call engine.grad() again"
                )
            return
        gathered, generation = self.native.unit_state(self.unit)
        if not gathered or generation != self.generation:
            raise StaleViewError(
                f"this view of {self._name()} belongs to a gather of unit {self.unit} that was released"
                + (" (the unit is gathered again: call engine.param() again)" if gathered else "")
            )

    def _name(self) -> str:
        return f"param {self.param} ({self.engine._names[self.param]!r})"


def _unwrap(x: Any) -> Any:
    """A View as a plain ndarray after checking its lease; containers unwrapped element by element."""
    if isinstance(x, View):
        x._check()
        return x.view(np.ndarray)
    if isinstance(x, tuple):
        return tuple(_unwrap(v) for v in x)
    if isinstance(x, list):
        return [_unwrap(v) for v in x]
    if isinstance(x, dict):
        return {k: _unwrap(v) for k, v in x.items()}
    return x


class View(np.ndarray):
    """A numpy array over engine memory (see the module's documentation). Operations on it behave as on an
    ``ndarray`` and return plain arrays, except slices, which are views with the same lease."""

    _lease: _Lease | None = None

    def __array_finalize__(self, obj: Any) -> None:
        self._lease = getattr(obj, "_lease", None)

    def _check(self) -> None:
        if self._lease is not None:
            self._lease.check()

    @property
    def valid(self) -> bool:
        """Whether the view may still be used (its unit is gathered in the same generation, or its gradient not
        yet declared ready)."""
        try:
            self._check()
            return True
        except StaleViewError:
            return False

    def numpy(self) -> np.ndarray:
        """A plain ndarray over the same memory, unguarded from here on (see the module's documentation)."""
        self._check()
        return self.view(np.ndarray)

    # ---- numpy's protocols -------------------------------------------------------------------------------------
    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
        out = kwargs.get("out")
        kwargs = _unwrap(kwargs)
        result = getattr(ufunc, method)(*_unwrap(inputs), **kwargs)
        if out is not None:  # in place (e.g. view += x): hand back the arrays the caller gave, views included
            return out[0] if len(out) == 1 else out
        return result

    def __array_function__(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        return func(*_unwrap(args), **_unwrap(kwargs))

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        self._check()
        plain = self.view(np.ndarray)
        if dtype is not None and np.dtype(dtype) != plain.dtype:
            return plain.astype(dtype)
        return plain.copy() if copy else plain

    def __dlpack__(self, *, stream: Any = None, max_version: Any = None, dl_device: Any = None, copy: Any = None) -> Any:
        if stream is not None and stream != -1:
            raise BufferError("libzero views live in host memory: no stream applies")
        if dl_device is not None and tuple(dl_device) != (1, 0):
            raise BufferError(f"libzero views live in host memory (kDLCPU); dl_device {tuple(dl_device)} asked for")
        self._check()
        plain = self.view(np.ndarray)
        if any(s < 0 for s in plain.strides):
            raise BufferError("a view with negative strides cannot be exported through DLPack; copy it first")
        if copy:  # the consumer asked for its own copy (the protocol lets the producer make it)
            plain = plain.copy()
        versioned = max_version is not None and tuple(max_version)[0] >= 1
        return _native.to_dlpack(plain, self._dlpack_code(plain.dtype), versioned)

    def _dlpack_code(self, dtype: np.dtype) -> int:
        """The element type to export: numpy's, except that uint16 bits of a bf16 buffer export as bf16."""
        lease_code = self._lease.zero_dtype if self._lease is not None else None
        if dtype == np.float32:
            return CODES["fp32"]
        if dtype == np.float16:
            return CODES["fp16"]
        if dtype == BF16 or (dtype == np.uint16 and lease_code == CODES["bf16"]):
            return CODES["bf16"]
        for name in ("fp64", "int64", "uint8", "int8"):  # frozen params' storage
            if dtype == NUMPY[name]:
                return CODES[name]
        raise BufferError(f"libzero views do not export {dtype} through DLPack")

    def __dlpack_device__(self) -> tuple[int, int]:
        return (1, 0)  # kDLCPU

    # ---- element access and the methods that read memory without going through a ufunc ------------------------
    def __getitem__(self, key: Any) -> Any:
        self._check()
        return super().__getitem__(_unwrap(key))

    def __setitem__(self, key: Any, value: Any) -> None:
        self._check()
        super().__setitem__(_unwrap(key), _unwrap(value))

    def __repr__(self) -> str:
        self._check()
        return f"View({np.array_repr(self.view(np.ndarray))})"

    def __str__(self) -> str:
        self._check()
        return str(self.view(np.ndarray))

    def __reduce__(self) -> Any:  # pickling copies the values into a plain array
        self._check()
        return self.view(np.ndarray).copy().__reduce__()

    def __iter__(self) -> Any:
        self._check()
        return iter(self.view(np.ndarray).copy())

    def __len__(self) -> int:
        return super().__len__()

    def __bool__(self) -> bool:
        self._check()
        return bool(self.view(np.ndarray))

    def __float__(self) -> float:
        self._check()
        return float(self.view(np.ndarray))

    def copy(self, order: Any = "C") -> np.ndarray:  # type: ignore[override]
        self._check()
        return self.view(np.ndarray).copy(order)

    def astype(self, *args: Any, **kwargs: Any) -> np.ndarray:  # type: ignore[override]
        self._check()
        return self.view(np.ndarray).astype(*args, **kwargs)

    def fill(self, value: Any) -> None:
        self._check()
        self.view(np.ndarray).fill(value)

    def tobytes(self, order: Any = "C") -> bytes:
        self._check()
        return self.view(np.ndarray).tobytes(order)

    def tolist(self) -> Any:
        self._check()
        return self.view(np.ndarray).tolist()

    def item(self, *args: Any) -> Any:
        self._check()
        return self.view(np.ndarray).item(*args)


# ndarray methods that read or write the data in C without passing through __array_ufunc__ or
# __array_function__: each checks the lease first. (Methods returning views of the same memory, such as reshape,
# ravel, transpose and view, need no check: the result is a View with the same lease.)
_DATA_METHODS = (
    "all", "any", "argmax", "argmin", "argpartition", "argsort", "byteswap", "choose", "clip", "compress", "conj",
    "conjugate", "cumprod", "cumsum", "diagonal", "dot", "dump", "dumps", "flatten", "getfield", "max", "mean", "min",
    "nonzero", "partition", "prod", "put", "repeat", "resize", "round", "searchsorted", "setfield", "sort", "std",
    "sum", "take", "tofile", "trace", "var", "__copy__", "__deepcopy__", "__int__", "__index__", "__complex__",
    "__format__", "__contains__",
)


def _checked(name: str) -> Any:
    method = getattr(np.ndarray, name)

    def call(self: View, *args: Any, **kwargs: Any) -> Any:
        self._check()
        return method(self.view(np.ndarray), *_unwrap(args), **_unwrap(kwargs))

    call.__name__ = name
    call.__doc__ = method.__doc__
    return call


for _name in _DATA_METHODS:
    if hasattr(np.ndarray, _name):
        setattr(View, _name, _checked(_name))


# DLPack's device types (DLDeviceType) a device engine's memory is exported as.
KDLCPU, KDLCUDA, KDLEXTDEV = 1, 2, 12


class DeviceView:
    """A param's values or gradient buffer in a device engine's memory, with the same lease as :class:`View` (it
    refuses to be used once the memory is no longer its own). The host must not touch device memory, so this is no
    numpy array: consumers take it through DLPack (``torch.from_dlpack(view)`` on CUDA: a tensor over the engine's
    memory, ordered after the engine's work on the consumer's stream), and the host reads and writes it with explicit
    copies (``numpy()``, ``copy_from()``). The emulator's memory is exported as ``kDLExtDev``, which no consumer
    reads."""

    __slots__ = ("_lease", "shape", "dtype", "__weakref__")

    def __init__(self, lease: _Lease, shape: tuple[int, ...], dtype: np.dtype) -> None:
        self._lease = lease
        self.shape = shape
        self.dtype = dtype

    def _check(self) -> None:
        self._lease.check()

    @property
    def valid(self) -> bool:
        """Whether the view may still be used."""
        try:
            self._check()
            return True
        except StaleViewError:
            return False

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    def _address(self) -> int:
        return int(self._lease.native.address(self._lease.param, self._lease.grad_epoch is not None))

    def numpy(self) -> np.ndarray:
        """A host copy of the values, complete on return (ordered after the engine's work)."""
        self._check()
        out = np.empty(self.shape, dtype=self.dtype)
        self._lease.native.copy(out.ctypes.data, self._address(), self.nbytes)
        return out

    def copy_from(self, values: Any) -> None:
        """Writes ``values`` (the view's shape, converted to its dtype) into the device memory, complete on return
        (ordered after the engine's work)."""
        self._check()
        if hasattr(values, "__dlpack_device__") and tuple(values.__dlpack_device__())[0] != KDLCPU:
            raise InvalidArgumentError("copy_from takes host values; copy device tensors with torch.from_dlpack(view)"
                                       ".copy_(tensor)")
        src = np.ascontiguousarray(np.asarray(values, dtype=self.dtype))
        if src.shape != self.shape:
            raise InvalidArgumentError(f"copy_from: values of shape {src.shape} into a view of shape {self.shape}")
        self._lease.native.copy(self._address(), src.ctypes.data, self.nbytes)

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        raise TypeError("a DeviceView is device memory, which the host must not touch: view.numpy() copies it to a "
                        "host array, torch.from_dlpack(view) shares it on the device")

    def __dlpack_device__(self) -> tuple[int, int]:
        device = self._lease.native.device()
        return (int(device[0]), int(device[1]))

    def __dlpack__(self, *, stream: Any = None, max_version: Any = None, dl_device: Any = None, copy: Any = None) -> Any:
        self._check()
        device = self.__dlpack_device__()
        if dl_device is not None and tuple(dl_device) != device:
            raise BufferError(f"libzero's memory is on DLPack device {device}; dl_device {tuple(dl_device)} asked for")
        if copy:
            raise BufferError("libzero exports its device memory as it is (copy=True asked for)")
        if device[0] == KDLCUDA and stream == 0:
            raise BufferError("stream 0 is ambiguous on CUDA (DLPack: 1 is the legacy default stream, 2 the "
                              "per-thread one)")
        if device[0] != KDLCUDA and stream is not None and stream != -1:
            raise BufferError(f"the memory of libzero's {self._lease.engine.device!r} device takes no stream")
        versioned = max_version is not None and tuple(max_version)[0] >= 1
        capsule = self._lease.native.device_dlpack(self._lease.param, self._lease.grad_epoch is not None, versioned,
                                                   self._lease)
        # DLPack's handshake, after every engine call that may queue work on the memory (the capsule's address):
        # the consumer's stream (None: the legacy default one, 1) waits for the engine's work; -1: the consumer
        # orders it itself.
        if device[0] == KDLCUDA and stream != -1:
            self._lease.native.order_stream(1 if stream is None else int(stream))
        return capsule

    def __repr__(self) -> str:
        return f"DeviceView(shape={self.shape}, dtype={self.dtype}, device={self._lease.engine.device!r})"


def make_view(engine: Any, param: int, what: str) -> Any:
    """A checked view of `param`'s values (`what` = "param") or gradient buffer ("grad"): a :class:`View` of host
    memory, or a :class:`DeviceView` on a device engine."""
    if not engine._infos:
        raise InvalidStateError("views of params and gradients exist after finalize(): call engine.finalize() first")
    lease = _Lease(engine, param, what)
    info = engine._infos[param]
    if what == "grad" and info.get("frozen"):
        raise InvalidArgumentError(f"param {param} ({engine._names[param]!r}) is frozen: it has no gradient")
    if what == "param":
        lease.unit = info["unit"]
        lease.zero_dtype = CODES[info["param_dtype"]]
    else:
        lease.grad_epoch = engine._grad_epoch(param)
        lease.zero_dtype = CODES[info["grad_dtype"]]
    if engine.device is not None:
        dtype = NUMPY[info["grad_dtype"] if what == "grad" else info["param_dtype"]]
        lease.native.address(param, what == "grad")  # fails as zero_param_data does (a unit not gathered)
        if what == "param":
            lease.generation = lease.native.unit_state(lease.unit)[1]
        device_view = DeviceView(lease, tuple(int(d) for d in info["shape"]), dtype)
        engine._leases.add(lease)
        return device_view
    array = lease.native.array(param, what == "grad", BF16, lease)
    if what == "param":
        # The generation after the array was made: zero_param_data succeeded, so the unit is gathered now.
        lease.generation = lease.native.unit_state(lease.unit)[1]
    view = array.view(View)
    view._lease = lease
    engine._leases.add(lease)
    return view
