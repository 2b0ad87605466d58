"""A gloo world of spawned processes for the benches that measure a distributed step on CPU.

``start(worker, world, payload)`` spawns ``world`` processes running ``worker(rank, world, port, payload, out)`` (``port``:
a free one on loopback for the process group; ``out``: the JSON file rank 0 writes its results to) without waiting;
``finish`` waits for them and returns what rank 0 wrote. Two worlds can run at once (each has its own port and file).
"""

from __future__ import annotations

import json
import os
import socket
import tempfile


def start(worker, world: int, payload):
    import torch.multiprocessing as mp

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    out = tempfile.mktemp(suffix=".json")
    context = mp.start_processes(worker, args=(world, port, payload, out), nprocs=world, join=False,
                                 start_method="spawn")
    return context, out


def finish(started):
    context, out = started
    while not context.join():
        pass
    with open(out) as handle:
        results = json.load(handle)
    os.unlink(out)
    return results
