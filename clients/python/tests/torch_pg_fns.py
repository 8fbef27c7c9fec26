"""Trainer bodies for test_torch_pg.py, run in spawned processes (module
level so that they pickle). Each makes the "collectived" default group with
collectived.torch.init_process_group, and most a Gloo group of the same
ranks beside it (dist.ProcessGroupGloo on a TCPStore), whose results on the
same inputs are the reference. Each returns a list of failures (strings)
or a dict of observations: the test asserts on them."""

from __future__ import annotations

import datetime
import os
import traceback
import zlib
from typing import Any, Callable

import torch
import torch.distributed as dist

import collectived.torch as ct

JOB = "pytest-job"
DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32,
          torch.int64, torch.int8, torch.uint8)
FLOATS = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
R = dist.ReduceOp
OPS = (("SUM", R.SUM), ("PRODUCT", R.PRODUCT), ("MIN", R.MIN), ("MAX", R.MAX), ("AVG", R.AVG))


def _init(sock: str, local_rank: int) -> ct.ProcessGroupCollectived:
    return ct.init_process_group(sock, job=JOB, local_rank=local_rank)


def _gloo(port: int) -> Any:
    rank, size = dist.get_rank(), dist.get_world_size()
    store = dist.TCPStore("127.0.0.1", port, size, rank == 0, datetime.timedelta(seconds=60))
    return dist.ProcessGroupGloo(store, rank, size)


def data(rank: int, dtype: Any, op: str, shape: tuple[int, ...], salt: int = 0) -> Any:
    """Per-rank inputs whose reductions are exact in every type and every
    order (small integers, quarters, powers of two), so that collectived's
    results must equal Gloo's bit for bit."""
    g = torch.Generator().manual_seed(zlib.crc32(repr((rank, str(dtype), op, shape, salt)).encode()))
    n = 1
    for s in shape:
        n *= s
    if op == "PRODUCT":
        choices = torch.tensor([1.0, 2.0] if dtype == torch.uint8 else
                               ([1.0, 2.0, -1.0, 0.5] if dtype in FLOATS else [1.0, 2.0, -1.0, -2.0]))
        v = choices[torch.randint(len(choices), (n,), generator=g)]
    else:
        lo = 0 if dtype == torch.uint8 else -8
        v = torch.randint(lo, 9, (n,), generator=g).double()
        if dtype in FLOATS:
            v = v / 4
    return v.to(dtype).reshape(shape)


def _gloo_allreduce(gloo: Any, x: Any, op: str) -> Any:
    """Gloo's allreduce of ``x`` (which it is not given): bfloat16 (Gloo
    has none) through float32, AVG (Gloo has none) as SUM / size."""
    y = x.float() if x.dtype == torch.bfloat16 else x.clone()
    o = dist.AllreduceOptions()
    o.reduceOp = R.SUM if op == "AVG" else dict((k, v) for k, v in OPS)[op]
    gloo.allreduce([y], o).wait()
    if op == "AVG":
        y = (y.double() / dist.get_world_size())
    return y.to(x.dtype)


def _gloo_bcast(gloo: Any, t: Any, root: int) -> None:
    o = dist.BroadcastOptions()
    o.rootRank = root
    gloo.broadcast([torch.view_as_real(t) if t.is_complex() else t], o).wait()


def _same(fails: list[str], what: str, got: Any, want: Any) -> None:
    if got.dtype != want.dtype or got.shape != want.shape or not torch.equal(got, want):
        fails.append(f"{what}: got {got.dtype} {tuple(got.shape)} {got.flatten()[:6].tolist()}, "
                     f"Gloo {want.dtype} {tuple(want.shape)} {want.flatten()[:6].tolist()}")


def _guard(fails: list[str], what: str, fn: Callable[[], None]) -> None:
    try:
        fn()
    except Exception:
        fails.append(f"{what}: raised {traceback.format_exc(limit=3)}")


def ops_vs_gloo(sock: str, local_rank: int, port: int) -> list[str]:
    """Every op x element type x reduce op, sync and async forms, against
    Gloo's results on the same inputs."""
    pg = _init(sock, local_rank)
    gloo = _gloo(port)
    rank, size = dist.get_rank(), dist.get_world_size()
    fails: list[str] = []
    shape = (2, 3)
    for dt in DTYPES:
        for op, rop in OPS:
            if op == "AVG" and dt not in FLOATS:
                continue
            x = data(rank, dt, op, shape)
            want = _gloo_allreduce(gloo, x, op)

            def sync(x: Any = x, rop: Any = rop, want: Any = want, what: str = f"all_reduce {op} {dt}") -> None:
                y = x.clone()
                dist.all_reduce(y, op=rop)
                _same(fails, what, y, want)
            _guard(fails, f"all_reduce {op} {dt}", sync)

            def async_wait(x: Any = x, rop: Any = rop, want: Any = want,
                           what: str = f"all_reduce async wait {op} {dt}") -> None:
                y = x.clone()
                w = dist.all_reduce(y, op=rop, async_op=True)
                if not isinstance(w, ct.Work):
                    fails.append(f"{what}: async_op gave {type(w)}")
                w.wait()
                if not w.is_completed() or not w.is_success():
                    fails.append(f"{what}: not completed/success after wait")
                _same(fails, what, y, want)
            _guard(fails, f"all_reduce async {op} {dt}", async_wait)

            def async_future(x: Any = x, rop: Any = rop, want: Any = want,
                             what: str = f"all_reduce future.then {op} {dt}") -> None:
                y = x.clone()
                fut = dist.all_reduce(y, op=rop, async_op=True).get_future()
                got = fut.then(lambda f: f.value()[0]).wait()
                if got is not y and not torch.equal(got, y):
                    fails.append(f"{what}: future's value is not the tensor")
                _same(fails, what, y, want)
            _guard(fails, f"all_reduce future {op} {dt}", async_future)

        for root in (0, size - 1):
            def bcast(dt: Any = dt, root: int = root, what: str = f"broadcast {dt} root {root}") -> None:
                x = data(rank, dt, "SUM", shape, salt=root)
                ref = (x.float() if dt == torch.bfloat16 else x.clone())
                _gloo_bcast(gloo, ref, root)
                y = x.clone()
                w = dist.broadcast(y, src=root, async_op=(root != 0))
                if w is not None:
                    w.get_future().wait()
                _same(fails, what, y, ref.to(dt))
            _guard(fails, f"broadcast {dt} {root}", bcast)

            def reduce(dt: Any = dt, root: int = root, what: str = f"reduce {dt} root {root}") -> None:
                for op, rop in OPS[:4]:
                    x = data(rank, dt, op, shape, salt=7)
                    red = _gloo_allreduce(gloo, x, op)  # every rank takes part
                    want = red if rank == root else x
                    y = x.clone()
                    dist.reduce(y, dst=root, op=rop)
                    _same(fails, f"{what} {op}", y, want)
            _guard(fails, f"reduce {dt} {root}", reduce)

        def gather(dt: Any = dt, what: str = f"all_gather {dt}") -> None:
            x = data(rank, dt, "SUM", shape, salt=3)
            src = x.float() if dt == torch.bfloat16 else x
            ref = [torch.empty_like(src) for _ in range(size)]
            gloo.allgather([ref], [src]).wait()
            ref = [r.to(dt) for r in ref]
            outs = [torch.empty_like(x) for _ in range(size)]
            dist.all_gather(outs, x)
            for i in range(size):
                _same(fails, f"{what} [{i}]", outs[i], ref[i])
            outs2 = [torch.empty_like(x) for _ in range(size)]
            dist.all_gather(outs2, x, async_op=True).wait()
            for i in range(size):
                _same(fails, f"{what} async [{i}]", outs2[i], ref[i])
            o = torch.empty((size * shape[0], shape[1]), dtype=dt)
            dist.all_gather_into_tensor(o, x)
            _same(fails, f"all_gather_into_tensor {dt}", o, torch.cat(ref))
            o2 = torch.empty((size * shape[0], shape[1]), dtype=dt)
            dist.all_gather_into_tensor(o2, x, async_op=True).get_future().wait()
            _same(fails, f"all_gather_into_tensor async {dt}", o2, torch.cat(ref))
        _guard(fails, f"all_gather {dt}", gather)

        def rscatter(dt: Any = dt, what: str = f"reduce_scatter {dt}") -> None:
            for op, rop in OPS:
                if op == "AVG" and dt not in FLOATS:
                    continue
                # even blocks (reduce_scatter), and uneven (reduce_scatterv)
                for counts in ([3] * size, [i + 1 for i in range(size)]):
                    blocks = [data(rank, dt, op, (c,), salt=11 + i) for i, c in enumerate(counts)]
                    want = _gloo_allreduce(gloo, torch.cat(blocks), op)
                    lo = sum(counts[:rank])
                    out = torch.empty(counts[rank], dtype=dt)
                    dist.reduce_scatter(out, blocks, op=rop)
                    _same(fails, f"{what} {op} counts {counts}", out, want[lo:lo + counts[rank]])
                x = data(rank, dt, op, (size * 2, 3), salt=5)
                want = _gloo_allreduce(gloo, x, op)
                out = torch.empty((2, 3), dtype=dt)
                dist.reduce_scatter_tensor(out, x, op=rop, async_op=True).wait()
                _same(fails, f"reduce_scatter_tensor {op} {dt}", out, want[2 * rank:2 * rank + 2])
        _guard(fails, f"reduce_scatter {dt}", rscatter)

    # Types the daemon does not reduce travel as bytes where bytes do.
    for dt in (torch.bool, torch.int16, torch.complex64):
        def odd(dt: Any = dt, what: str = f"broadcast/all_gather {dt}") -> None:
            g = torch.Generator().manual_seed(rank)
            x = (torch.randn(5, generator=g) * 100).to(dt) if dt != torch.complex64 else \
                torch.randn(5, generator=g, dtype=dt)

            def raw(t: Any) -> Any:  # Gloo carries none of these: it moves their bytes
                return t.reshape(-1).view(torch.uint8)
            ref = raw(x.clone())
            _gloo_bcast(gloo, ref, 1)
            y = x.clone()
            dist.broadcast(y, src=1)
            if y.dtype != dt:
                fails.append(f"broadcast {dt} gave {y.dtype}")
            _same(fails, f"broadcast {dt}", raw(y), ref)
            refs = [torch.empty_like(raw(x)) for _ in range(size)]
            gloo.allgather([refs], [raw(x)]).wait()
            outs = [torch.empty_like(x) for _ in range(size)]
            dist.all_gather(outs, x)
            for i in range(size):
                _same(fails, f"all_gather {dt} [{i}]", raw(outs[i]), refs[i])
        _guard(fails, f"bytes {dt}", odd)

    # A tensor that is not contiguous: reduced in a copy, copied back.
    def noncontig() -> None:
        base = data(rank, torch.float32, "SUM", (3, 4), salt=9)
        want = _gloo_allreduce(gloo, base[:, 1].contiguous(), "SUM")
        y = base.clone()
        col = y[:, 1]
        dist.all_reduce(col)
        _same(fails, "all_reduce of a column", y[:, 1].contiguous(), want)
        others = torch.cat([y[:, :1], y[:, 2:]], 1)
        _same(fails, "all_reduce of a column leaves the rest", others,
              torch.cat([base[:, :1], base[:, 2:]], 1))
    _guard(fails, "non-contiguous", noncontig)

    # Float data of every magnitude: equal to Gloo's to float tolerance
    # (the order of additions differs).
    def random_floats() -> None:
        g = torch.Generator().manual_seed(100 + rank)
        x = torch.randn(10007, generator=g) * 1e3
        want = _gloo_allreduce(gloo, x, "SUM")
        y = x.clone()
        dist.all_reduce(y)
        torch.testing.assert_close(y, want, rtol=1e-5, atol=5e-3)  # sums of +-4e3: float32's eps x 4e3 x 4
    _guard(fails, "random float32", random_floats)

    # all_reduce_coalesced, barrier.
    def coalesced() -> None:
        xs = [data(rank, torch.float32, "SUM", (k,), salt=k) for k in (1, 100, 5000)]
        wants = [_gloo_allreduce(gloo, x, "SUM") for x in xs]
        ys = [x.clone() for x in xs]
        dist.all_reduce_coalesced(ys)
        for y, w in zip(ys, wants):
            _same(fails, f"all_reduce_coalesced {y.numel()}", y, w)
        dist.barrier()
        dist.barrier(async_op=True).wait()
    _guard(fails, "coalesced", coalesced)

    # The group itself.
    if dist.get_backend() != "collectived" or pg.getBackendName() != "collectived":
        fails.append(f"backend is {dist.get_backend()}")
    if (pg.rank(), pg.size()) != (pg.client.rank, pg.client.size):
        fails.append("group's rank and size are not the daemon's")
    ct.destroy_process_group()
    return fails


def errors(sock: str, local_rank: int) -> dict[str, Any]:
    """Errors as torch users expect them, on every rank; the world goes on
    after each."""
    _init(sock, local_rank)
    rank, size = dist.get_rank(), dist.get_world_size()
    out: dict[str, Any] = {}

    def catch(key: str, fn: Callable[[], Any]) -> None:
        try:
            fn()
            out[key] = None
        except Exception as e:
            out[key] = (type(e).__name__, isinstance(e, RuntimeError), str(e))

    # Mismatched shapes (same count): MismatchError on every rank.
    t = torch.ones((2, 3) if rank == 0 else (3, 2))
    catch("shapes", lambda: dist.all_reduce(t))
    # Mismatched counts in all_gather, async: the Work's wait raises it, and
    # the future fails with the same class.
    x = torch.ones(2 if rank == 1 else 3)
    outs = [torch.empty_like(x) for _ in range(size)]
    w = dist.all_gather(outs, x, async_op=True)
    catch("gather_wait", w.wait)
    catch("gather_future", lambda: w.get_future().wait())
    # The world goes on.
    y = torch.full((4,), float(rank))
    dist.all_reduce(y)
    out["after"] = y.tolist()
    # Refused before sending, on every rank alike.
    catch("band", lambda: dist.all_reduce(torch.ones(2, dtype=torch.int32), op=R.BAND))
    catch("bool_sum", lambda: dist.all_reduce(torch.ones(2, dtype=torch.bool)))
    catch("avg_int", lambda: dist.all_reduce(torch.ones(2, dtype=torch.int64), op=R.AVG))
    catch("all_to_all", lambda: dist.all_to_all_single(torch.empty(size), torch.ones(size)))
    catch("new_group_all", lambda: dist.new_group())
    catch("new_group_some", lambda: dist.new_group([0, 1]))
    z = torch.full((2,), 1.0)
    dist.all_reduce(z)
    out["after2"] = z.tolist()
    ct.destroy_process_group()
    return out


def killed(sock: str, local_rank: int, victim: int) -> dict[str, Any]:
    """World rank ``victim`` dies (os._exit) in the middle of training;
    every other rank's next collective fails with TrainerLostError (its
    class kept: a RuntimeError), a DDP backward too."""
    _init(sock, local_rank)
    rank = dist.get_rank()
    out: dict[str, Any] = {"rank": rank}
    t = torch.ones(3)
    dist.all_reduce(t)
    if rank == victim:
        os._exit(3)
    try:
        u = torch.ones(1000)
        for _ in range(1000):  # the victim never comes: the first call fails
            dist.all_reduce(u)
        out["error"] = None
    except Exception as e:
        out["error"] = (type(e).__name__, isinstance(e, RuntimeError), str(e))
    return out


def killed_ddp(sock: str, local_rank: int, victim: int) -> dict[str, Any]:
    """As :func:`killed`, under DDP: the backward of the step the victim
    missed raises a RuntimeError naming the error's class."""
    _init(sock, local_rank)
    rank = dist.get_rank()
    out: dict[str, Any] = {"rank": rank}
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    try:
        for step in range(100):
            if rank == victim and step == 2:
                os._exit(3)
            opt.zero_grad()
            model(torch.randn(16, 8)).pow(2).sum().backward()
            opt.step()
        out["error"] = None
    except Exception as e:
        out["error"] = (type(e).__name__, isinstance(e, RuntimeError), str(e)[:2000])
    out["step"] = step
    return out


def hooks_and_broadcasts(sock: str, local_rank: int, port: int) -> dict[str, Any]:
    """DDP on Gloo (another backend) with collectived's comm hooks: the
    gradients equal Gloo's own averaging (to float tolerance; bfloat16's
    to its precision, and sent as bfloat16); broadcast_parameters and
    broadcast_optimizer_state from a root other than 0."""
    import collectived

    client = ct.connect(sock, job=JOB, local_rank=local_rank)
    rank, size = client.rank, client.size
    store = dist.TCPStore("127.0.0.1", port, size, rank == 0, datetime.timedelta(seconds=60))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=size)
    out: dict[str, Any] = {"rank": rank}
    sent: list[str] = []
    real = client.allreduce_async

    def spy(x: Any, op: str = "sum", **kw: Any) -> Any:
        sent.append(f"{x.dtype}/{op}")
        return real(x, op, **kw)
    client.allreduce_async = spy  # type: ignore[method-assign]

    def net() -> Any:
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(20, 30), torch.nn.ReLU(), torch.nn.Linear(30, 5))

    g = torch.Generator().manual_seed(1000 + rank)
    x, y = torch.randn(64, 20, generator=g), torch.randn(64, 5, generator=g)
    grads = {}
    for kind in ("gloo", "allreduce_hook", "bf16_compress_hook"):
        model = torch.nn.parallel.DistributedDataParallel(net())
        if kind != "gloo":
            model.register_comm_hook(client, getattr(ct, kind))
        sent.clear()
        torch.nn.functional.mse_loss(model(x), y).backward()
        grads[kind] = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
        out[f"sent_{kind}"] = sorted(set(sent))
    out["hook_vs_gloo"] = float((grads["allreduce_hook"] - grads["gloo"]).abs().max())
    out["scale"] = float(grads["gloo"].abs().max())
    out["bf16_vs_gloo"] = float((grads["bf16_compress_hook"] - grads["gloo"]).abs().max())

    # broadcast_parameters: rank-seeded models become rank 2's.
    torch.manual_seed(rank)
    m = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))
    m[1].num_batches_tracked += rank  # an int64 buffer
    ct.broadcast_parameters(m, root=2, group=client)
    out["params"] = {k: v.clone() for k, v in m.state_dict().items()}
    # broadcast_optimizer_state: Adam after a step on rank 1's own data.
    torch.manual_seed(7)
    m2 = torch.nn.Linear(6, 2)
    opt = torch.optim.Adam(m2.parameters(), lr=0.01 * (rank + 1))
    m2(torch.randn(3, 6, generator=g)).sum().backward()
    opt.step()
    ct.broadcast_optimizer_state(opt, root=1, group=client)
    sd = opt.state_dict()
    out["opt_lr"] = sd["param_groups"][0]["lr"]
    out["opt_state"] = {k: {n: (t.clone() if isinstance(t, torch.Tensor) else t) for n, t in v.items()}
                        for k, v in sd["state"].items()}
    out["object"] = ct.broadcast_object({"rank": rank, "t": torch.arange(3) * rank}
                                        if rank == 3 else None, root=3, group=client)
    try:
        ct.allreduce_hook(object(), None)
    except collectived.UsageError as e:
        out["bad_state"] = str(e)
    dist.destroy_process_group()
    client.close()
    return out
