"""libzero's whole zero_step against PyTorch's AdamW on the same CPU, in one process, measured side by side.

    python3 bench/step_vs_torch.py [--lib build/release/libzero.so] [--sizes 16,64] [--threads 1,2] [--reps 9]
                                   [--device cuda|emulator]

One rank, stage 0, fp32 AdamW (lr 1e-3, weight decay 0.01), one param of S Mi elements. Each repetition times, in
turn: libzero's zero_step (norm, clip decision, fused update, gradient clearing; the gradients are written
before the timer starts), torch's AdamW(fused=True).step() alone (no norm, no clipping, no zeroing), the same
plus clip_grad_norm_ and zero_grad(set_to_none=False) (what a DeepSpeed or FSDP step does), and torch's default
(foreach) AdamW with those. libzero three ways: with clipping (gradient_clipping 1.0), without (0; the norm pass
still runs first, since a non-finite step is skipped), and without clipping or the skip
(zero_optimization.compute_grad_norm false: the norm comes from the optimizer pass). Prints the median of the
paired ratios (libzero time / torch time). libzero is driven through its C ABI with ctypes (the
Python binding needs an extension built for the interpreter), so the figures include nothing but the calls.

--device cuda: the device engine (zero_engine_set_device) against torch's on the GPU, params, states and gradients in
device memory (torch's timings between torch.cuda.synchronize() calls; zero_step without a framework stream returns
with its device work done); the ratio the device-engine issue asks for is "lz noclp / fused" (goal <= 1.0).
--device emulator runs the same against torch on the CPU to check the script itself: the emulator is a test tool,
its times are not a device's.
"""
import argparse
import ctypes
import statistics
import time

import torch


class ParamDesc(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("name", ctypes.c_char_p), ("ndim", ctypes.c_int32),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("dtype", ctypes.c_int32), ("unit", ctypes.c_int32),
                ("group", ctypes.c_int32), ("init_data", ctypes.c_void_p), ("init_dtype", ctypes.c_int32),
                ("reserved", ctypes.c_int32)]


class Zero:
    def __init__(self, path):
        self.lib = ctypes.CDLL(path)
        self.lib.zero_last_error.restype = ctypes.c_char_p

    def ok(self, status):
        if status != 0:
            raise RuntimeError(self.lib.zero_last_error().decode())

    def engine(self, n, clip, threads, check=True, device=None):
        comm, engine = ctypes.c_void_p(), ctypes.c_void_p()
        self.ok(self.lib.zero_comm_create_single(ctypes.byref(comm)))
        config = ('{"optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "weight_decay": 0.01}},'
                  ' "gradient_clipping": %s, "zero_optimization": {"stage": 0, "compute_grad_norm": %s}}'
                  % (clip, "true" if check else "false")).encode()
        self.ok(self.lib.zero_engine_create(ctypes.byref(engine), config, comm))
        self.lib.zero_comm_destroy(comm)
        if device is not None:
            self.ok(self.lib.zero_engine_set_device(engine, device.encode()))
        self.ok(self.lib.zero_engine_set_num_threads(engine, threads))
        shape = (ctypes.c_int64 * 1)(n)
        desc = ParamDesc()
        self.ok(self.lib.zero_param_desc_init(ctypes.byref(desc), ctypes.c_size_t(ctypes.sizeof(desc))))
        desc.name, desc.ndim, desc.shape = b"w", 1, shape
        pid = ctypes.c_int32()
        self.ok(self.lib.zero_engine_add_param(ctypes.byref(pid), engine, ctypes.byref(desc)))
        self.ok(self.lib.zero_engine_finalize(engine))
        return engine

    def micro_step(self, engine, grad, device=None):
        """Writes `grad` (a torch tensor) into the engine's gradient buffer, outside the timed region (a device
        engine's with zero_engine_copy: its buffer was cleared by the step, so a copy is the add)."""
        ptr = ctypes.c_void_p()
        self.ok(self.lib.zero_gather(engine, 0))
        self.ok(self.lib.zero_grad_data(ctypes.byref(ptr), engine, 0))
        if device is None:
            view = torch.frombuffer((ctypes.c_float * grad.numel()).from_address(ptr.value), dtype=torch.float32)
            view.add_(grad)
        else:
            if grad.is_cuda:
                torch.cuda.synchronize()
            self.ok(self.lib.zero_engine_copy(engine, ptr, ctypes.c_void_p(grad.data_ptr()),
                                              ctypes.c_size_t(grad.numel() * 4)))
        self.ok(self.lib.zero_grad_ready(engine, 0))
        self.ok(self.lib.zero_release(engine, 0))
        self.ok(self.lib.zero_backward_end(engine))

    def step(self, engine):
        self.ok(self.lib.zero_step(None, engine))


def timed(fn, cuda=False):
    if cuda:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    if cuda:
        torch.cuda.synchronize()
    return time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", default="build/release/libzero.so")
    ap.add_argument("--sizes", default="16,64")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--device", choices=["cuda", "emulator"])
    args = ap.parse_args()
    z = Zero(args.lib)
    cuda = args.device == "cuda"
    on = torch.device("cuda") if cuda else torch.device("cpu")
    where = {None: "the CPU", "cuda": "the GPU (%s)" % (torch.cuda.get_device_name() if cuda else ""),
             "emulator": "libzero's host emulator against torch on the CPU (a check of the script, not a measurement)"}
    print("zero_step vs torch %s AdamW on %s, stage 0, one rank, fp32; median of %d paired ratios (< 1: libzero "
          "faster)" % (torch.__version__, where[args.device], args.reps))
    print("%5s %4s %8s %8s %8s | %8s %8s %9s %10s | %8s %8s" % (
        "Mi", "thr", "lz clip", "lz noclp", "lz 1pass", "noclip/", "1pass/", "clip/", "clip/", "torch", "torch"))
    print("%5s %4s %8s %8s %8s | %8s %8s %9s %10s | %8s %8s" % (
        "", "", "ms", "ms", "ms", "fused", "fused", "fused+cz", "foreach+cz", "fused ms", "f+cz ms"))
    for size in [float(s) for s in args.sizes.split(",")]:
        n = int(size * (1 << 20))
        for threads in [int(t) for t in args.threads.split(",")] if args.device is None else [1]:
            torch.set_num_threads(threads)
            grad = torch.randn(n, device=on) * 1e-3
            dev = args.device
            p_fused = torch.nn.Parameter(torch.zeros(n, device=on))
            p_cz = torch.nn.Parameter(torch.zeros(n, device=on))
            p_fe = torch.nn.Parameter(torch.zeros(n, device=on))
            for p in (p_fused, p_cz, p_fe):
                p.grad = grad.clone()
            o_fused = torch.optim.AdamW([p_fused], lr=1e-3, weight_decay=0.01, fused=True)
            o_cz = torch.optim.AdamW([p_cz], lr=1e-3, weight_decay=0.01, fused=True)
            o_fe = torch.optim.AdamW([p_fe], lr=1e-3, weight_decay=0.01, foreach=True)

            def torch_cz(p, o):
                torch.nn.utils.clip_grad_norm_([p], 1.0)
                o.step()
                o.zero_grad(set_to_none=False)

            # One engine at a time (a process holds one device engine), each repetition timing it and then torch's
            # three steps, so that every libzero time has torch's of the same moment to be divided by.
            rows = {}
            for kind, clip, check in (("lz_clip", "1.0", True), ("lz_free", "0", True), ("lz_one", "0", False)):
                engine = z.engine(n, clip, threads, check=check, device=dev)
                pairs = []
                for rep in range(args.reps + 1):
                    z.micro_step(engine, grad, dev)
                    p_cz.grad.copy_(grad)
                    p_fe.grad.copy_(grad)
                    t = (timed(lambda: z.step(engine), cuda), timed(o_fused.step, cuda),
                         timed(lambda: torch_cz(p_cz, o_cz), cuda), timed(lambda: torch_cz(p_fe, o_fe), cuda))
                    if rep > 0:  # the first is the warm-up (state allocation, first touch)
                        pairs.append(t)
                z.lib.zero_engine_destroy(engine)
                rows[kind] = pairs
            med = lambda kind, i=0: statistics.median(t[i] for t in rows[kind])
            ratio = lambda kind, i: statistics.median(t[0] / t[i] for t in rows[kind])
            print("%5g %4d %8.2f %8.2f %8.2f | %8.2f %8.2f %9.2f %10.2f | %8.2f %8.2f" % (
                size, threads, 1e3 * med("lz_clip"), 1e3 * med("lz_free"), 1e3 * med("lz_one"),
                ratio("lz_free", 1), ratio("lz_one", 1), ratio("lz_clip", 2), ratio("lz_clip", 3),
                1e3 * med("lz_free", 1), 1e3 * med("lz_clip", 2)), flush=True)


if __name__ == "__main__":
    main()
