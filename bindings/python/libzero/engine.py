"""The engine: registration, the training calls, checkpoints and statistics, over the C ABI."""

from __future__ import annotations

import contextlib
import json
import math
import os
import weakref
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, NamedTuple, Union

import numpy as np

from . import _native
from ._dtypes import CODES, NUMPY, code_of_array, frozen_code_of_array
from .comm import Comm
from .errors import InvalidArgumentError, InvalidStateError
from .views import DeviceView, View, make_view

ConfigLike = Union[Mapping[str, Any], str, "os.PathLike[str]"]

# ZERO_INHERIT: a group hyper-parameter taken from the config's optimizer.params.
_INHERIT = -1.0


def config_text(config: ConfigLike) -> str:
    """The JSON text of a config given as a dict, JSON text, or the path of a JSON file."""
    if isinstance(config, Mapping):
        return json.dumps(config)
    if isinstance(config, os.PathLike):
        with open(config, encoding="utf-8") as f:
            return f.read()
    if isinstance(config, str):
        if config.lstrip().startswith("{"):
            return config
        if os.path.exists(config):
            with open(config, encoding="utf-8") as f:
                return f.read()
        raise FileNotFoundError(f"the config {config!r} is neither JSON text nor an existing file")
    raise TypeError(f"a config is a dict, JSON text or a path, not {type(config).__name__}")


def config_check(config: ConfigLike, world_size: int = 1) -> str:
    """What libzero will do with a DeepSpeed config on ``world_size`` ranks (the report of ``zero-config check``),
    without creating anything. Raises the error engine creation would raise."""
    return _native.config_check(config_text(config), int(world_size))


def _holds_frozen(array_dtype: np.dtype, dtype: str) -> bool:
    """Whether an init array of ``array_dtype`` holds a frozen param of ``dtype`` as it is: its own numpy type, raw
    bytes (uint8), anything for opaque bytes, and bf16 as 16-bit words."""
    if dtype == "bytes" or array_dtype == np.uint8 or array_dtype == NUMPY[dtype]:
        return True
    return dtype == "bf16" and array_dtype in (np.dtype(np.uint16), np.dtype(np.int16))


class StepResult(NamedTuple):
    """What :meth:`Engine.step` did."""

    step: int  # optimizer steps taken so far, this one included (skipped steps not counted)
    loss_scale: float  # the loss scale used (1 without fp16)
    grad_norm: float  # global L2 norm of the averaged gradients, before clipping
    skipped: bool  # True if the step was skipped (a non-finite gradient)
    lr: float  # group 0's learning rate for this step


class Engine:
    """A ZeRO engine on ``comm`` configured by a DeepSpeed config (a dict, JSON text or a path).

    Life cycle: ``add_param_group`` / ``add_param``, then ``finalize()``; per micro-step ``gather``/``release``
    units around their use, add gradients into ``grad(i)`` and declare them with ``grad_ready(i)``, then
    ``backward_end()``; after ``gradient_accumulation_steps`` micro-steps ``step()``. Use it as a context
    manager, or call ``close()``.

    ``device`` (experimental): ``"cuda"`` puts the model states in the current CUDA device's memory and runs the norm
    and the step there (at several ranks, collectives through host memory); ``"emulator"`` runs the same on libzero's host emulator of a device, a test
    tool, not a device. ``param()`` and ``grad()`` are then :class:`~libzero.views.DeviceView` objects: DLPack
    exports (``torch.from_dlpack`` on CUDA) and explicit copies, never numpy arrays over device memory.
    """

    def __init__(self, config: ConfigLike, comm: Comm | None = None, device: str | None = None) -> None:
        self._comm = comm if comm is not None else Comm.world()
        self._native: Any = _native.Engine(config_text(config), self._comm._native)
        self._device: str | None = None
        if device is not None:
            try:
                self.set_device(device)
            except BaseException:
                self._native.close()
                raise
        self._names: list[str] = []
        self._ids: dict[str, int] = {}
        self._inits: list[Any] = []  # initial values, read by finalize on rank 0
        self._infos: list[dict[str, Any]] = []
        self._ready: list[int] = []  # per param: grad_ready calls so far
        # The epoch of gradient views: every call after which a view of a gradient buffer may be stale (a micro-step's
        # end, a step, a load) starts a new one, even a call that failed (it may have moved the buffers first).
        self._grad_views_epoch = 0
        self._leases: weakref.WeakSet[Any] = weakref.WeakSet()  # of the views alive
        info = self._native.info()
        self._param_dtype = info["param_dtype"]

    # ---- registration --------------------------------------------------------------------------------------------
    def add_param_group(
        self,
        name: str | None = None,
        *,
        lr: float | None = None,
        weight_decay: float | None = None,
        betas: tuple[float, float] | None = None,
        eps: float | None = None,
    ) -> int:
        """A param group with its own hyper-parameters (None: the config's). Returns its id (1, 2, ...)."""

        def v(x: float | None) -> float:
            return _INHERIT if x is None else float(x)

        b1, b2 = (None, None) if betas is None else betas
        return int(self._n.add_param_group(name, v(lr), v(weight_decay), v(b1), v(b2), v(eps)))

    def add_param(
        self,
        name: str,
        shape: Sequence[int] | int,
        unit: int = 0,
        group: int = 0,
        init: Any = None,
        *,
        frozen: bool = False,
        dtype: str | None = None,
        model_parallel_duplicate: bool = False,
    ) -> int:
        """Registers a param; returns its id (0, 1, ... in call order). ``unit``: its gather unit (units are
        numbered in forward order). ``init``: initial values (read on rank 0 at finalize; float32 keeps bf16/fp16
        training's fp32 master weights exact), or None for zeros.

        ``frozen=True``: a param the optimizer does not train (ZERO_PARAM_FROZEN): no gradient, master or optimizer
        state; whole on every rank at stages 0-2, sharded at stage 3. It keeps ``dtype`` ("fp32", "bf16", "fp16",
        "fp64", "int64", "uint8", "int8", "bytes"; by default ``init``'s, else the compute dtype), its bytes never
        converted.

        ``model_parallel_duplicate=True``: this rank's copy of a param another model-parallel rank holds whole and
        counts in the gradient norm (ZERO_PARAM_MODEL_PARALLEL_DUPLICATE: a LayerNorm or a row-parallel bias on
        tensor-parallel ranks other than 0, Megatron's rule), left out of the norm here (:meth:`set_model_parallel`)."""
        dims = [int(shape)] if isinstance(shape, int) else [int(d) for d in shape]
        init_array = None
        init_code = -1
        frozen_code = -2  # trained
        if frozen:
            if dtype is not None and dtype not in CODES:
                raise InvalidArgumentError(f"add_param {name!r}: dtype {dtype!r} is not one of {sorted(CODES)}")
            frozen_code = CODES[dtype] if dtype is not None else -1
            if init is not None:
                array = np.ascontiguousarray(np.asarray(init))
                if dtype is None:  # the array's own type names it
                    frozen_code, array = frozen_code_of_array(array, self._param_dtype)
                    if frozen_code == CODES["bytes"]:
                        dims = list(array.shape)
                elif not _holds_frozen(array.dtype, dtype):
                    raise InvalidArgumentError(
                        f"add_param {name!r}: init is {array.dtype}, the param is frozen as {dtype}: a frozen param's "
                        "bytes are kept as they are, so give init in its dtype (or as raw uint8 bytes)"
                    )
                element = NUMPY[dtype].itemsize if dtype is not None else array.itemsize
                if array.nbytes != math.prod(dims) * element:
                    raise InvalidArgumentError(
                        f"add_param {name!r}: init has {array.nbytes} bytes, a frozen {dtype or array.dtype} param "
                        f"of shape {tuple(dims)} has {math.prod(dims) * element}"
                    )
                init_array = array.reshape(-1).view(np.uint8)  # its bytes, as they are
        elif init is not None:
            init_array = np.ascontiguousarray(init if isinstance(init, np.ndarray) else np.asarray(init, np.float32))
            if init_array.size != math.prod(dims):
                raise InvalidArgumentError(
                    f"add_param {name!r}: init has {init_array.size} elements, the shape {tuple(dims)} needs "
                    f"{math.prod(dims)}"
                )
            init_code = code_of_array(init_array, self._param_dtype)
        pid = int(
            self._n.add_param(
                name, dims, int(unit), int(group), init_array, init_code, frozen_code, bool(model_parallel_duplicate)
            )
        )
        self._names.append(name)
        self._ids[name] = pid
        self._inits.append(init_array)
        self._ready.append(0)
        return pid

    def set_model_parallel(self, group: Comm | None) -> None:
        """ZeRO beside tensor or pipeline parallelism: this engine's communicator is its data-parallel group and
        ``group`` its model-parallel group (the ranks holding the other parts of the same model replica). The
        gradient norm, the clip and the non-finite skip then span the whole job, finalize checks the group's
        settings, and checkpoints keep each model-parallel rank's part apart (``mp_rank_XX``). Before
        :meth:`finalize`, on every rank; None (or a group of one rank): none."""
        self._n.set_model_parallel(group._native if group is not None else None)
        self._model_parallel = group  # kept alive beside the engine's own reference

    def finalize(self) -> None:
        """Checks that every rank registered the same params and config, lays out and allocates the shards and
        broadcasts rank 0's initial values. Collective."""
        self._n.finalize()
        self._inits = []
        self._infos = [self._native.param_info(i) for i in range(len(self._names))]

    # ---- what the engine is --------------------------------------------------------------------------------------
    @property
    def info(self) -> dict[str, Any]:
        """rank, world_size, stage, dtypes, SIMD path, units, threads, timeout (zero_engine_info)."""
        return dict(self._n.info())

    @property
    def rank(self) -> int:
        return int(self._n.info()["rank"])

    @property
    def world_size(self) -> int:
        return int(self._n.info()["world_size"])

    @property
    def num_units(self) -> int:
        return int(self._n.info()["num_units"])

    @property
    def param_names(self) -> list[str]:
        return list(self._names)

    def param_id(self, name: str) -> int:
        try:
            return self._ids[name]
        except KeyError:
            raise InvalidArgumentError(f"no param is named {name!r}") from None

    def param_info(self, param: int | str) -> dict[str, Any]:
        """name, shape, unit, group, numel, param_dtype, grad_dtype."""
        return dict(self._n.param_info(self._id(param)))

    def unit_info(self, unit: int) -> dict[str, Any]:
        """gathered, num_params, generation, numel."""
        return dict(self._n.unit_info(int(unit)))

    # ---- one micro-step ------------------------------------------------------------------------------------------
    def gather(self, unit: int) -> None:
        """Makes a unit's full params available (stage 3: all-gathers them; collective)."""
        self._n.gather(int(unit))

    def release(self, unit: int) -> None:
        """Gives a gathered unit back; views of its params become stale."""
        self._n.release(int(unit))

    def release_modified(self, unit: int, modifier_rank: int) -> None:
        """Releases a gathered unit after rank ``modifier_rank`` wrote new values into its params (``param(i)[...] =
        ...``): every rank's params, shards and fp32 master take that rank's values (DeepSpeed's
        ``GatheredParameters(modifier_rank=...)``). Collective: every rank, the same unit and modifier rank."""
        self._grad_views_epoch += 1
        self._n.release_modified(int(unit), int(modifier_rank))

    @contextlib.contextmanager
    def gathered(self, *units: int, modifier_rank: int | None = None) -> Iterator[None]:
        """``with engine.gathered(u): ...`` gathers the units in order and releases them in reverse, also when the
        block raises. With ``modifier_rank``, what that rank wrote into the units' params inside the block becomes
        every rank's (release_modified); if the block raises, the units are released unchanged."""
        done: list[int] = []
        failed = True
        try:
            for u in units:
                self.gather(u)
                done.append(u)
            yield
            failed = False
        finally:
            while done:
                u = done.pop()
                if modifier_rank is None or failed:
                    self.release(u)
                else:
                    try:
                        self.release_modified(u, modifier_rank)
                    except BaseException:
                        for rest in reversed(done):  # the engine may be unusable now; free what is left anyway
                            with contextlib.suppress(Exception):
                                self.release(rest)
                        raise

    def prefetch(self, unit: int) -> None:
        """Stage 3: starts the all-gather of ``unit`` now, so that it moves while you compute. Collective."""
        self._n.prefetch(int(unit))

    @property
    def device(self) -> str | None:
        """The device the engine runs on (``"cuda"``, ``"emulator"``), or None for the CPU engine."""
        return self._device

    def set_device(self, device: str) -> None:
        """Runs the engine on ``device`` (see the class's documentation); before ``finalize()``."""
        self._n.set_device(device)
        self._device = device

    def set_stream(self, stream: Any) -> None:
        """A device engine's work is ordered on the framework's ``stream`` from now on (a ``torch.cuda.Stream``, or
        a ``cudaStream_t`` as an integer; 0 is CUDA's legacy default stream), through events: no call waits for the
        device except the step's norm. Without it every call's device work is complete when it returns."""
        handle = getattr(stream, "cuda_stream", stream)
        self._n.set_stream(int(handle))

    def param(self, param: int | str) -> View | DeviceView:
        """The param's values (a numpy view of engine memory, in the compute dtype; a frozen param's in its own)
        while its unit is gathered. Writes are not preserved (values change only in step()), except on the modifier
        rank of ``gathered(..., modifier_rank=r)`` / ``release_modified``."""
        return make_view(self, self._id(param), "param")

    def grad(self, param: int | str) -> View | DeviceView:
        """The buffer this rank ADDS the param's gradient into for this micro-step (fp32 by default), valid until
        grad_ready(param). With fp16, the gradient of the loss multiplied by loss_scale."""
        return make_view(self, self._id(param), "grad")

    def grad_ready(self, param: int | str) -> None:
        """Declares the param's gradient for this micro-step complete (stages 2-3 may reduce its bucket now:
        collective then)."""
        pid = self._id(param)
        self._n.grad_ready(pid)
        self._ready[pid] += 1

    def backward_end(self) -> None:
        """Ends the micro-step: reduces every bucket still pending. Collective."""
        self._grad_views_epoch += 1
        self._n.backward_end()

    def step(self, partial_window: bool = False, loss_averaged: bool = False) -> StepResult:
        """The optimizer step, after gradient_accumulation_steps micro-steps. Collective.

        ``partial_window``: step after however many micro-steps have ended (an epoch's remainder), averaging over
        those, the bits of an engine configured with that many. ``loss_averaged``: each micro-step's loss was already
        divided by the window's micro-steps (DeepSpeed's ``scale_wrt_gas=False``): average over ranks only."""
        self._grad_views_epoch += 1
        return StepResult(**self._n.step(bool(partial_window), bool(loss_averaged)))

    # ---- hyper-parameters ----------------------------------------------------------------------------------------
    @property
    def loss_scale(self) -> float:
        """The factor to multiply the loss by before backward (fp16), 1.0 otherwise."""
        return float(self._n.loss_scale())

    def set_lr(self, lr: float, group: int = -1) -> None:
        """Sets a group's learning rate (-1: every group) for the following steps. Every rank must set the same."""
        self._n.set_lr(int(group), float(lr))

    def get_lr(self, group: int = 0) -> float:
        """The learning rate the next step gives a group (the config's scheduler evaluated there, where it has
        one)."""
        return float(self._n.get_lr(int(group)))

    def set_num_threads(self, threads: int) -> None:
        """Optimizer threads of this rank (0: automatic). Results do not depend on it."""
        self._n.set_num_threads(int(threads))

    # ---- checkpoints -----------------------------------------------------------------------------------------------
    def save_checkpoint(
        self, directory: str | os.PathLike[str], tag: str, *, exclude_frozen: bool = False
    ) -> None:
        """Writes a sharded checkpoint to ``directory/tag`` and points ``directory/latest`` at it. Collective.
        ``exclude_frozen``: leave the frozen params' bytes out (DeepSpeed's exclude_frozen_parameters)."""
        self._n.save_checkpoint(os.fspath(directory), str(tag), bool(exclude_frozen))

    def load_checkpoint(self, directory: str | os.PathLike[str], tag: str | None = None) -> None:
        """Loads ``directory/tag`` (the latest when None), saved at any rank count and stage. Collective."""
        self._grad_views_epoch += 1
        self._n.load_checkpoint(os.fspath(directory), None if tag is None else str(tag))

    # ---- statistics ------------------------------------------------------------------------------------------------
    def memory_stats(self) -> dict[str, int]:
        """Bytes this rank allocated per category."""
        return dict(self._n.memory_stats())

    @property
    def window(self) -> dict[str, int]:
        """Where the engine is in its accumulation window: micro_steps ended since the last step, of
        accumulation_steps (step()'s turn when they are equal), total_micro_steps since finalize, and the optimizer
        steps taken. Experimental."""
        return dict(self._n.window())

    def memory_placement(self) -> dict[str, int]:
        """Where this rank's model states live: host_bytes (what host memory holds, offloading's buffers included),
        nvme_bytes (the files of offload_optimizer / offload_param with device "nvme"), staging_bytes (the host
        memory offloading uses: the optimizer state's window, the params' buffer and one shard). Experimental."""
        return dict(self._n.memory_placement())

    def comm_stats(self) -> dict[str, Any]:
        """Traffic per collective kind since finalize (calls, bytes, wire_bytes)."""
        return dict(self._n.comm_stats())

    def recent_collectives(self) -> list[dict[str, Any]]:
        """The engine's last collectives, oldest first (for hang reports; any thread)."""
        return list(json.loads(self._n.recent_collectives()))

    # ---- teardown ----------------------------------------------------------------------------------------------------
    def abort(self) -> None:
        """Makes the engine unusable now; other ranks' collectives fail naming this rank. Any thread."""
        if self._native is not None:
            self._native.abort()

    def close(self) -> None:
        """Destroys the engine (local). Views still alive keep its memory until they go, and raise when used."""
        native, self._native = self._native, None
        if native is not None and len(self._leases) == 0:
            native.close()
        # Otherwise the C engine is destroyed when the last array over its memory goes (each holds a reference).

    @property
    def closed(self) -> bool:
        return self._native is None

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        if self._native is None:
            return "<libzero.Engine (closed)>"
        i = self._native.info()
        return f"<libzero.Engine stage {i['stage']}, rank {i['rank']} of {i['world_size']}, {i['num_params']} params>"

    # ---- internals -------------------------------------------------------------------------------------------------
    @property
    def _n(self) -> Any:
        if self._native is None:
            raise InvalidStateError("the engine was closed")
        return self._native

    def _id(self, param: int | str) -> int:
        if isinstance(param, str):
            return self.param_id(param)
        pid = int(param)
        if not 0 <= pid < len(self._names):
            raise InvalidArgumentError(f"param id {pid} is not registered (ids 0..{len(self._names) - 1})")
        return pid

    def _grad_epoch(self, param: int) -> tuple[int, int]:
        return (self._grad_views_epoch, self._ready[param])
