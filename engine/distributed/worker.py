"""A tensor-parallel worker process (rank >= 1): `python -m engine.distributed.worker`.

It joins the group, loads its shard of the model and a KV cache of its heads, tells the
driver it is ready (or why it is not), then computes the steps the driver broadcasts until
told to stop. It dies with the driver (PR_SET_PDEATHSIG), and a driver gone mid-collective
ends it with a connection error: no orphans either way."""

from __future__ import annotations

import argparse
import ctypes
import os
import pickle
import signal
import sys

import torch
import torch.distributed as dist


def _die_with_parent() -> None:
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
        if os.getppid() == 1:  # the driver died before prctl
            sys.exit(1)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--size", type=int, required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--setup", required=True, help="pickled (EngineConfig, kv scales)")
    parser.add_argument("--threads", type=int, required=True)
    args = parser.parse_args()
    _die_with_parent()
    torch.set_num_threads(args.threads)
    with open(args.setup, "rb") as f:
        config, kv_scales = pickle.load(f)

    from engine.distributed.group import TPGroup
    from engine.model_store import build_tp_rank
    from engine.resolve import resolve_device

    device = resolve_device(config.device)
    if device.type == "cuda":
        device = torch.device("cuda", args.rank)
        torch.cuda.set_device(device)
    group = TPGroup(args.rank, args.size, args.port, device)
    error = None
    try:
        runner = build_tp_rank(config, device, group, kv_scales)
    except Exception as e:  # said to the driver, which raises it
        error = f"{type(e).__name__}: {e}"
    dist.gather_object(error, None, dst=0)
    if error is not None:
        group.destroy()
        return 1
    try:
        runner.serve_worker()
    except BaseException:
        group.destroy()
        raise
    # Told to stop: leave without tearing gloo down. Its threads and sockets go with the
    # process; destroyed here, or in the interpreter's finalization, a worker still aborted
    # now and then ('terminate called without an active exception', exit -6) while the
    # driver waited for it (CI, stop 54). The driver closes its end once the workers are gone.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
