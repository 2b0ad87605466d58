"""TransferQueue functions the recipe wraps: the v1 trainer's timing of its reads and writes (``phase_timing``)."""

from __future__ import annotations

from typing import Callable, Iterable

from recipe_dapo.compat import touches

TRANSFER_QUEUE = ("0.1.11",)
"""The TransferQueue releases the sites below were checked on."""

_WHY = "the v1 trainer times its process's TransferQueue calls per step (timing_s/tq_read, tq_write); callers look " \
       "them up as tq.<name> at call time"


@touches("transfer_queue.kv_clear", how="wraps", checked=TRANSFER_QUEUE, params=("keys", "partition_id"), why=_WHY)
@touches("transfer_queue.kv_batch_put", how="wraps", checked=TRANSFER_QUEUE, params=("keys", "partition_id"), why=_WHY)
@touches("transfer_queue.kv_put", how="wraps", checked=TRANSFER_QUEUE, params=("key", "partition_id"), why=_WHY)
@touches("transfer_queue.kv_batch_get", how="wraps", checked=TRANSFER_QUEUE, params=("keys", "partition_id"), why=_WHY)
@touches("transfer_queue.kv_list", how="wraps", checked=TRANSFER_QUEUE, params=("partition_id",), why=_WHY)
def wrap_functions(module, names: Iterable[str], wrap: Callable[[Callable], Callable]) -> list[str]:
    """Replace each of ``module``'s functions ``names`` (default module: ``transfer_queue``) by ``wrap(function)``,
    keeping the original as the wrapper's ``recipe_dapo_wrapped``; an already wrapped one is left alone. Returns the
    names wrapped now (:func:`restore_functions` puts them back)."""
    if module is None:
        import transfer_queue as module
    wrapped = []
    for name in names:
        function = getattr(module, name, None)
        if function is None or getattr(function, "recipe_dapo_wrapped", None) is not None:
            continue
        wrapper = wrap(function)
        if wrapper is function:
            continue
        wrapper.recipe_dapo_wrapped = function
        setattr(module, name, wrapper)
        wrapped.append(name)
    return wrapped


def restore_functions(module, names: Iterable[str]) -> None:
    """Put back the originals of ``module``'s functions that :func:`wrap_functions` wrapped."""
    if module is None:
        import transfer_queue as module
    for name in names:
        original = getattr(getattr(module, name, None), "recipe_dapo_wrapped", None)
        if original is not None:
            setattr(module, name, original)
