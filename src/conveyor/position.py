"""A loader's position: ``state_dict()`` and ``load_state_dict()``, and the checks that refuse a
state naming a position this loader cannot reach.

A position is the epoch and the batches handed out of it (map-style: the prefix of the epoch's
order, plus any handed out ahead of it; a stream: the batches each replica handed out), how
the sampler's iteration began (its own state, or the RNG states it is replayed from), and
the workers' base seed. A state taken at an epoch's end names the next epoch with
``replay=True``: its draws are replayed (no fetching) before the next begins.
"""

from __future__ import annotations

import base64
import threading
import warnings
from typing import TYPE_CHECKING, Any

import numpy as np

from . import _torch, replay
from .distributed import ShardedIterable, rank_and_world
from .order import is_stateless, sized
from .samplers import BatchSampler

if TYPE_CHECKING:
    from .epoch import Run
    from .loader import DataLoader

__all__ = ["STATE_VERSION", "position", "run_position", "load", "handed_all", "replays", "replay_ended", "check_replicas",
           "dataset_len", "stream_rank_world"]

STATE_VERSION = 1


def run_position(run: Run[Any], take_in: bool = False) -> dict[str, Any]:
    """A run's position, for the loader's state_dict (``take_in``: results waiting in the
    pipes may be taken in, see ``_stream_over``; never from a finalizer)."""
    order = run.order
    where: dict[str, Any] = {
        "epoch": run.epoch, "batches": run.yielded if run.replicas is not None else order.prefix,
        "finished": run.finished and run.exhausted or _stream_over(run, take_in),
        "base_seed": run.origin.base_seed, "generator": run.origin.generator_state}
    if order.ahead:
        where["done"] = sorted(order.ahead)  # handed out of order, beyond ``batches``
    if run.replicas is not None:
        where["replicas"] = list(run.replicas.done)  # batches each replica of the stream handed out
    if order.rngs is not None:
        where["replayed"] = order.replayed_where()
    return where


def _stream_over(run: Run[Any], take_in: bool) -> bool:
    """A stream's every worker has said it is exhausted and every batch was handed out:
    the epoch is over, though the iterator has not raised its StopIteration yet."""
    if run.replicas is None or run.finished or run.replicas.dropping:
        return False
    live = run.rotation.live
    if (take_in and any(live) and run.inflight and run.loader._device_stage is None
            and run.ex.kind != "inline" and threading.get_ident() == run.thread):
        # the workers' word may be waiting in the pipes: take it in (no batch is handed out).
        # Only in the thread that iterates: a checkpoint thread's poll would run into the loop's
        # ("concurrent poll() invocation"), and its refill would write orders into the same pipes
        run.poll(0)
    if run.inflight:
        return False
    buffered = list(run.reorder.buffer.values())
    if any(not r.exhausted for r in buffered):
        return False  # batches still to hand out
    said = {max(r.worker, 0) for r in buffered}
    return all(not alive or w in said for w, alive in enumerate(live))


def stream_rank_world(loader: DataLoader[Any]) -> tuple[int, int]:
    """The (rank, world size) a stream is sharded by: a ShardedIterable's own, else this
    process's (what ``shard_iterable`` inside ``__iter__`` reads)."""
    if isinstance(loader.dataset, ShardedIterable):
        return loader.dataset.rank, loader.dataset.world_size
    return rank_and_world()


def check_replicas(loader: DataLoader[Any], resume: dict[str, Any]) -> None:
    """A stream resumed mid-epoch must be read by as many replicas as it was saved from.

    Each worker's copy of an IterableDataset shards the stream by the worker count, and
    a stream cannot seek: the resumed epoch makes again the batches each replica had
    handed out and drops them. With another count the shards differ, and dropping by
    count would lose and repeat samples without a word."""
    replicas = resume.get("replicas")
    if not loader._iterable or resume["finished"] or not replicas:
        return
    now = max(1, loader.num_workers)
    if len(replicas) != now:
        saved = f"num_workers={len(replicas)}" if len(replicas) > 1 else "num_workers=0 or 1"
        raise ValueError(
            f"this state was saved mid-epoch from an IterableDataset read by {len(replicas)} replica(s) "
            f"({saved}); this loader has num_workers={loader.num_workers}, which shards the stream "
            f"otherwise: the batches already handed out cannot be found again. Resume with {saved}, "
            f"or from a state saved at an epoch's end")


def position(loader: DataLoader[Any]) -> dict[str, Any]:
    if loader._resume is not None and loader._loaded is not None:
        return dict(loader._loaded)  # loaded and not iterated yet: still that position
    run = loader._last_run
    if run is not None and not run.finished:
        run.begin()
    where = run_position(run, take_in=True) if run is not None and not run.finished else loader._ended
    state: dict[str, Any] = {"version": STATE_VERSION, "dataset_len": dataset_len(loader), "seed": loader.seed,
                             "batch_size": None if loader.batch_size is None else int(loader.batch_size),
                             "drop_last": bool(loader.drop_last)}
    if loader._iterable:
        state["rank_world"] = list(stream_rank_world(loader))
    gen = loader.generator
    gstate = None
    if where is None:  # nothing iterated yet: the next epoch starts afresh
        state.update(epoch=loader._epoch, batches=0, replay=False, sampler=None)
        gstate = gen.get_state() if _torch.is_generator(gen) else None
    else:
        if where["finished"] or handed_all(loader, where["batches"]):
            # the next epoch starts afresh, after replaying (without fetching) the draws of
            # the one that ended, which is what the sampler's state describes. An epoch
            # whose every batch was handed out has ended too, StopIteration or not: a
            # trainer that counts len(loader) batches (Lightning) saves there and then
            # asks for the next epoch, as it would of this loader (torchdata's
            # StatefulDataLoader resumes such a state at the next epoch as well)
            state.update(epoch=where["epoch"] + 1, batches=0, replay=True)
        else:
            state.update(epoch=where["epoch"], batches=where["batches"], replay=False)
            for key in ("done", "replicas"):
                if where.get(key):
                    state[key] = where[key]
        state.update(base_seed=where["base_seed"], sampler=sampler_state(loader, where))
        if where.get("replayed") is not None:
            replayed = where["replayed"]
            state["replayed"] = dict(replayed, rngs=replay.as_json(replayed["rngs"]))
        gstate = where["generator"]
    if gstate is not None:
        state["generator"] = base64.b64encode(bytes(gstate.numpy().tobytes())).decode("ascii")
    return state


def handed_all(loader: DataLoader[Any], batches: int) -> bool:
    """True when ``batches`` handed out are all of a map-style epoch's."""
    if loader._iterable:
        return False
    try:
        return bool(batches >= len(loader._index_sampler))
    except TypeError:  # a sampler without a length
        return False


def sampler_state(loader: DataLoader[Any], where: dict[str, Any]) -> Any:
    """The index sampler's state: how its most recent iteration began (None for a sampler
    resumed by replaying: ``where["replayed"]`` holds how)."""
    if loader._iterable or replays(loader) or is_stateless(loader._index_sampler):
        return None
    return loader._index_sampler.state_dict()


def replays(loader: DataLoader[Any]) -> bool:
    """True when the index sampler keeps no state (torch's samplers, a list, a custom
    one): a resumed epoch replays it from the RNG states its iteration began with
    (``replay``)."""
    if loader._iterable:
        return False
    sampler = loader._index_sampler
    if getattr(sampler, "state_dict", None) is None or (
            isinstance(sampler, BatchSampler) and getattr(sampler.sampler, "state_dict", None) is None):
        return not is_stateless(sampler)
    return False


def replay_ended(loader: DataLoader[Any], replayed: dict[str, Any]) -> None:
    """Draw the whole ended epoch again from its RNG states (no fetching), checking what
    it draws, so the next epoch draws as it would have after it.

    A sampler with ``set_epoch`` (torch's DistributedSampler) takes its epoch from the
    caller, who has set the next one by now: the replay draws that one, so it is not
    checked, and without generators of its own there is nothing for it to advance."""
    sampler = loader._index_sampler
    told = callable(getattr(replay.inner(sampler), "set_epoch", None))
    if told and not replayed["rngs"].get("own"):
        return
    got = n = 0
    with replay.Replaying(replayed["rngs"], sampler):
        for b in sampler:
            got = replay.digest(got, b)
            n += 1
    problem = replay.check(sampler, replayed.get("digest"), got, n, int(replayed.get("batches", n)))
    if problem and not told:
        warnings.warn(problem, UserWarning, stacklevel=3)


def load(loader: DataLoader[Any], state: dict[str, Any]) -> None:
    """Continue from ``state``: the rest of the interrupted epoch, then the same epochs after."""
    if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
        raise ValueError(f"not a conveyor DataLoader state of version {STATE_VERSION}: {state!r:.200}")
    for run in list(loader._runs):
        if not run.finished and run.yielded > 0:
            raise RuntimeError("load_state_dict() while an iterator of this loader is running: finish "
                               "or abandon the epoch (or create a new loader) before loading a state")
    if loader._device_stage is not None:
        loader._device_stage.reset()  # an epoch begun but not yet handed out: dropped
    n = dataset_len(loader)
    if state.get("dataset_len") != n:
        raise ValueError(f"this state was saved for a dataset of length {state.get('dataset_len')}, "
                         f"but this loader's dataset has length {n}")
    if state.get("seed") != loader.seed:
        raise ValueError(f"this state was saved with seed={state.get('seed')}, this loader has seed={loader.seed}")
    check_position(loader, state)
    if int(state.get("batches") or 0) > 0:  # a position counted in batches: they must be the same batches
        for key in ("batch_size", "drop_last"):
            if key in state and state[key] != getattr(loader, key):
                raise ValueError(f"this state was saved mid-epoch with {key}={state[key]!r}, this loader has "
                                 f"{key}={getattr(loader, key)!r}: its {state['batches']} batches handed out would "
                                 f"be other samples")
        saved = tuple(state["rank_world"]) if loader._iterable and "rank_world" in state else None
        now = stream_rank_world(loader) if saved is not None else None
        if saved is not None and saved != now:
            assert now is not None
            raise ValueError(f"this state was saved mid-epoch by rank {saved[0]} of {saved[1]}, and this loader "
                             f"is rank {now[0]} of {now[1]}: a stream's share of each rank follows the world "
                             "size, so the batches already handed out cannot be found again. Resume with "
                             "the saved world size, or from a state saved at an epoch's end")
    sampler_state = state.get("sampler")
    replayed = state.get("replayed") if replays(loader) else None
    if replayed is not None and not (isinstance(replayed, dict) and isinstance(replayed.get("rngs"), dict)):
        raise ValueError(f"state['replayed'] should hold the RNG states of a sampler without "
                         f"state_dict(), got {replayed!r:.200}")
    if sampler_state is not None:
        sampler = loader._index_sampler
        load = getattr(sampler, "load_state_dict", None)
        if load is None:
            raise TypeError(f"{type(sampler).__name__} has no load_state_dict(): cannot resume its position")
        load(sampler_state)
    gen = loader.generator
    if "generator" in state and _torch.is_generator(gen):
        torch = _torch.get()
        assert torch is not None
        raw = base64.b64decode(state["generator"])
        gen.set_state(torch.frombuffer(bytearray(raw), dtype=torch.uint8))
    replay = bool(state.get("replay"))
    done = state.get("done") or []
    if not isinstance(done, list) or not all(isinstance(p, int) and p > int(state["batches"]) for p in done):
        raise ValueError(f"state['done'] should list batch positions after state['batches'], got {done!r:.200}")
    replicas = state.get("replicas")
    if replicas is not None and not (isinstance(replicas, list) and all(
            isinstance(c, int) and c >= 0 for c in replicas) and sum(replicas) == int(state["batches"])):
        raise ValueError(f"state['replicas'] should count the batches of each replica, got {replicas!r:.200}")
    loader._resume = {"epoch": int(state["epoch"]) - replay, "batches": int(state["batches"]),
                    "base_seed": state.get("base_seed"), "finished": replay,
                    "replay": sampler_state is not None, "done": done, "replicas": replicas,
                    "replayed": replayed}
    loader._loaded = dict(state)
    loader._epoch = int(state["epoch"])


def check_position(loader: DataLoader[Any], state: dict[str, Any]) -> None:
    """Refuse a state that names no position this loader can reach (checked before any of
    it is taken): else it would be loaded, and the loader would resume elsewhere without a word."""
    total = None if loader._iterable else sized(loader._index_sampler)  # batches in an epoch

    def whole(v: Any) -> bool:
        return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))

    replay = state.get("replay", False)
    if not isinstance(replay, (bool, np.bool_)):
        raise ValueError(f"state['replay'] should be True or False, got {replay!r:.100}")
    batches = state.get("batches")
    if replay and (batches or state.get("done") or state.get("replicas")):
        raise ValueError(f"state['replay'] is True, which names an epoch's end, but state['batches'] is "
                         f"{batches!r:.100}" + (f" and state['done'] is {state.get('done')!r:.100}"
                                                if state.get("done") else "")
                         + ": a state saved mid-epoch has replay False")
    epoch = state.get("epoch")
    low = 1 if replay else 0  # a replayed state names the epoch after the one it replays
    if not whole(epoch) or epoch < low:
        raise ValueError(f"state['epoch'] should be a whole number >= {low}"
                         + (" (state['replay'] is True: the epoch after the one replayed)" if replay else "")
                         + f", got {epoch!r:.100}")
    if not whole(batches) or batches < 0 or total is not None and batches > total:
        span = f"from 0 to {total} (the batches of an epoch)" if total is not None else ">= 0"
        raise ValueError(f"state['batches'] should be a whole number {span}, got {batches!r:.100}")
    done = state.get("done") or []
    last = None if total is None else total - 1
    if not isinstance(done, list) or not all(whole(p) and p > batches and (last is None or p <= last)
                                             for p in done) or len(set(done)) != len(done):
        span = f"from {batches + 1} to {last}" if last is not None else f"after {batches}"
        raise ValueError(f"state['done'] should list batch positions {span} (handed out ahead of "
                         f"state['batches']={batches}), each once, got {done!r:.200}")
    check_sampler_seeds(state.get("sampler"), loader._index_sampler, "state['sampler']")


def check_sampler_seeds(saved: Any, sampler: Any, path: str) -> None:
    """A seeded sampler's saved seed must be this loader's sampler's: another shuffled
    other samples, without a word."""
    while isinstance(saved, dict) and sampler is not None:
        if saved.get("mode") == "seed" and "seed" in saved:
            mine = getattr(sampler, "seed", None)
            if mine is not None and saved["seed"] != mine:
                raise ValueError(f"{path}['seed'] is {saved['seed']!r:.100}, but this loader's sampler "
                                 f"({type(sampler).__name__}) has seed {mine}: it would shuffle other "
                                 "samples. Resume with the seed the state was saved with")
        saved, sampler, path = saved.get("sampler"), getattr(sampler, "sampler", None), f"{path}['sampler']"


def dataset_len(loader: DataLoader[Any]) -> int | None:
    try:
        return len(loader.dataset)
    except TypeError:
        return None
