"""Independent pieces of work (sampling chains, ensemble members) spread over processes.

Chains of a batched sampler move in lockstep: every NUTS iteration waits for the longest
trajectory of any chain, and one batched computation gains little from a second core on small
networks. Groups of chains (or members) in separate processes, one core each, run as
independent work, as NumPyro's parallel chains do. The processes are spawned (not forked: a
forked child would inherit the parent's threads and compiled state) and each limits its torch
threads to its share of the cores.

Spawning re-imports the caller's main module in every child: a script that uses
``num_processes`` must keep its work under ``if __name__ == "__main__":``.
"""

from __future__ import annotations

from concurrent.futures import ProcessPoolExecutor

import torch

from pyrobnn.utils.progress import tqdm
from pyrobnn.utils.validation import check_positive_int

__all__ = ["run_in_processes", "split_rows", "concat_rows"]


def _limit_threads(threads: int) -> None:
    torch.set_num_threads(threads)


def run_in_processes(fn, calls, threads_per_process=None, progress: bool = False, desc: str = ""):
    """``[fn(*args, **kwargs) for args, kwargs in calls]``, each call in its own spawned process
    (all at once), results in order. ``fn`` and the arguments must pickle (module-level
    functions, modules, tensors). Each process runs ``threads_per_process`` torch threads
    (default: this process's threads divided among the calls, at least one)."""
    calls = list(calls)
    if not calls:
        return []
    if threads_per_process is None:
        threads_per_process = max(1, torch.get_num_threads() // len(calls))
    check_positive_int("threads_per_process", threads_per_process)
    context = torch.multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(len(calls), mp_context=context, initializer=_limit_threads, initargs=(threads_per_process,)) as pool:
        futures = [pool.submit(fn, *args, **kwargs) for args, kwargs in calls]
        with tqdm(total=len(futures), disable=not progress, desc=desc, unit="process", dynamic_ncols=True) as bar:
            for future in futures:
                future.result()
                bar.update(1)
        return [f.result() for f in futures]


def split_rows(rows: torch.Tensor, parts: int) -> list:
    """``rows`` (``(K, ...)``) in at most ``parts`` contiguous groups of near-equal size."""
    check_positive_int("num_processes", parts)
    return [g for g in torch.tensor_split(rows, min(parts, rows.shape[0])) if g.shape[0]]


def concat_rows(dicts: list) -> dict:
    """Per key, the groups' tensors joined along their first (chain or member) dimension; a
    value that is not a tensor (a sampler's path and its reason) is kept once where every group
    has the same, else as the list of the groups' values."""
    out = {}
    for k in dicts[0]:
        values = [d[k] for d in dicts]
        if isinstance(values[0], torch.Tensor):
            out[k] = torch.cat(values, 0)
        else:
            out[k] = values[0] if all(v == values[0] for v in values) else values
    return out
