"""The pipe protocol between the main process and its workers: frames, many per read, split ones
(in this process; what travels from real workers is tests/integration/test_wire_workers.py)."""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import threading
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from typing import Any, NamedTuple

import numpy as np
import pytest
import torch

from conveyor._tree import tree_map
from conveyor.executors.task import Inbox, Order, Result, Task, send


def _pipe() -> tuple[Any, Any]:
    reader, writer = mp.Pipe(duplex=False)
    return reader, writer


def test_many_messages_come_in_one_take_in_order() -> None:
    reader, writer = _pipe()
    inbox = Inbox(reader)
    sent = [Result(k, 0, batch=[k] * k) for k in range(5)] + [Order((Task(9, 0, [1, 2]),))]
    for msg in sent[:3]:
        send(writer, msg)
    for msg in sent[3:]:
        writer.send(msg)  # Connection's own framing (a worker's hello) reads the same
    got = inbox.take()
    assert got == sent
    assert not inbox.eof
    reader.close(), writer.close()


def test_send_is_what_connection_recv_reads() -> None:
    reader, writer = _pipe()
    order = Order((Task(3, 1, [4, 5, 6]),), freed=(1, 2))
    send(writer, order)
    assert reader.recv() == order
    reader.close(), writer.close()


def test_a_message_split_across_reads_waits_for_its_rest() -> None:
    reader, writer = _pipe()
    inbox = Inbox(reader)
    data = pickle.dumps(Result(7, 1, batch="x" * 100))
    frame = len(data).to_bytes(4, "big") + data
    for cut in (2, 4, 50):  # inside the length, right after it, inside the pickle
        os.write(writer.fileno(), frame[:cut])
        assert inbox.take() == []
        os.write(writer.fileno(), frame[cut:] + frame)  # the rest, then one more whole
        assert [m.seq for m in inbox.take()] == [7, 7]
    reader.close(), writer.close()


def test_long_length_header() -> None:
    # Connection writes -1 and an 8-byte length for messages over 2 GiB; the same frame,
    # around a small pickle, must read the same (without sending 2 GiB here)
    reader, writer = _pipe()
    inbox = Inbox(reader)
    data = pickle.dumps(Result(11, 0))
    head = (-1).to_bytes(4, "big", signed=True) + len(data).to_bytes(8, "big")
    os.write(writer.fileno(), head[:7])
    assert inbox.take() == []
    os.write(writer.fileno(), head[7:] + data)
    assert [m.seq for m in inbox.take()] == [11]
    reader.close(), writer.close()


def test_a_message_larger_than_the_pipe_arrives_over_several_reads() -> None:
    reader, writer = _pipe()
    inbox = Inbox(reader)
    big = Result(1, 0, batch=bytes(range(256)) * 2048)  # 512 KiB: the writer blocks until read
    t = threading.Thread(target=send, args=(writer, big))
    t.start()
    got: list[Any] = []
    while not got:
        assert reader.poll(10)
        got = inbox.take()
    t.join(10)
    assert got == [big]
    reader.close(), writer.close()


@pytest.mark.parametrize("bell", [False, True])
def test_a_ctrl_c_in_the_middle_of_a_message_is_raised_once_it_is_all_out(
        monkeypatch: pytest.MonkeyPatch, bell: bool) -> None:
    # a KeyboardInterrupt between two pieces of a large order left half a frame in the pipe:
    # the worker read the orders after it (the stop, the next epoch's) as its rest
    import conveyor.executors.task as task
    from conveyor.executors.task import Doorbell

    reader, writer = _pipe()
    inbox = Inbox(reader)
    ring = Doorbell.make() if bell else None
    writes = []
    real = os.write

    def write(fd: int, data: Any) -> int:
        writes.append(len(data))
        if len(writes) == (2 if bell else 1):  # (without a bell, one write takes it all)
            raise KeyboardInterrupt  # what os.write raises when a Ctrl-C comes as it waits
        return real(fd, data)

    monkeypatch.setattr(task.os, "write", write)
    big = Order(tasks=(), freed=tuple(range(30000)))  # ~150 KB: several writes
    got: list[Any] = []
    reading = threading.Thread(target=lambda: got.extend(_take_all(inbox, reader, 2)))
    reading.start()
    with pytest.raises(KeyboardInterrupt):
        send(writer, big, ring)
    send(writer, Order(tasks=(), freed=(7,)), ring)  # the next order, after it
    reading.join(10)
    assert got == [big, Order(tasks=(), freed=(7,))]
    assert len(writes) >= (3 if bell else 2)
    reader.close(), writer.close()
    if ring is not None:
        ring.close()


def _take_all(inbox: Inbox, reader: Any, n: int) -> list[Any]:
    out: list[Any] = []
    while len(out) < n and reader.poll(10):
        out.extend(inbox.take())
    return out


def test_end_of_pipe_sets_eof_and_drops_a_cut_message() -> None:
    reader, writer = _pipe()
    inbox = Inbox(reader)
    send(writer, Result(1, 0))
    data = pickle.dumps(Result(2, 0))
    os.write(writer.fileno(), len(data).to_bytes(4, "big") + data[:3])  # the writer dies mid-message
    writer.close()
    assert [m.seq for m in inbox.take()] == [1]
    assert not inbox.eof
    assert inbox.take() == []
    assert inbox.eof
    reader.close()


class Pair(NamedTuple):
    a: Any
    b: Any


class Frozen(Mapping):  # type: ignore[type-arg]
    def __init__(self, d: dict[str, Any]) -> None:
        self.d = dict(d)

    def __getitem__(self, k: str) -> Any:
        return self.d[k]

    def __iter__(self) -> Iterator[str]:
        return iter(self.d)

    def __len__(self) -> int:
        return len(self.d)


def test_tree_map_keeps_every_container_kind() -> None:
    tree = {"p": Pair(1, [2, (3, "s")]), "o": OrderedDict(x=4), "f": Frozen({"y": 5}), "b": b"raw"}
    out = tree_map(lambda v: v * 10 if isinstance(v, int) else v, tree)
    assert out["p"] == Pair(10, [20, (30, "s")]) and type(out["p"]) is Pair
    assert type(out["o"]) is OrderedDict and out["o"] == {"x": 40}
    assert type(out["f"]) is Frozen and dict(out["f"]) == {"y": 50}
    assert out["b"] == b"raw"


_SHARED = torch.arange(4)


@pytest.mark.parametrize("batch", [
    torch.arange(6.0).reshape(2, 3),  # the batch is one array
    [None, torch.ones(2), "s", None, np.arange(3), 7, (None, torch.zeros(0))],
    {"a": None, "b": Pair(np.float32(1.5), torch.full((2,), 3)), "c": [], "d": OrderedDict(z=torch.ones(1, 1))},
    None,
    ("no arrays", 1, None),
    # a lone 0-d integer leaf: bytearray(arr) read it as a length (100 zero bytes; 0 bytes for 0)
    torch.tensor(100),
    np.array(0, dtype=np.uint8),
    np.array(300, dtype=">i4"),
    # flat lists and tuples of arrays (decode's shortcut), and the shapes that must not take it
    [torch.ones(2), np.arange(3)],
    (torch.ones(2, 2), torch.tensor([1])),
    [[torch.ones(1)], torch.zeros(2)],
    [_SHARED, _SHARED],
], ids=["one-array", "list", "dict", "none", "no-arrays", "one-0d-int", "one-0d-zero", "one-0d-big-endian",
        "flat-list", "flat-tuple", "nested-first", "same-twice"])
def test_the_message_puts_each_array_back_where_it_was(batch: Any) -> None:
    """The message carries the tree with None where each array was: user Nones, scalars and
    strings around them stay as they were, through a pickle as the pipe carries it."""
    from conveyor.transport import Packed, Views, decode, encode

    tree, holes, leaves, blob = encode(batch, None)
    sent = pickle.loads(pickle.dumps((tree, holes, leaves, (), 0, 0, blob)))
    assert all(type(rec) is tuple for rec in sent[2])  # plain tuples only: no class of ours
    out = decode(Packed._make(sent), Views(), output="torch")

    def flat(t: Any) -> list[Any]:
        got: list[Any] = []
        tree_map(got.append, t)
        return got

    want, have = flat(batch), flat(out)
    assert len(want) == len(have)
    for w, h in zip(want, have):
        if isinstance(w, (torch.Tensor, np.ndarray)):
            assert type(h) is type(w) and h.dtype == w.dtype and h.shape == w.shape
            np.testing.assert_array_equal(np.asarray(h), np.asarray(w))
        else:
            assert type(h) is type(w) and h == w
    assert type(out) is type(batch)
    if batch is not None and len(want) == 2 and want[0] is want[1]:
        assert have[0] is have[1], "one object sent twice comes back as one object"


def test_the_workers_writer_tells_collate_which_leaves_it_never_takes() -> None:
    """Small leaves travel in the message: collate must not even ask for them (that asking
    cost ~20 us a batch), and large ones still land in the slot."""
    from conveyor.collate import default_collate, use_allocator
    from conveyor.transport import SlotPool, Writer
    from conveyor.transport import segment

    if not segment.available():
        pytest.skip("no POSIX shared memory here")
    pool = SlotPool(segment.new_prefix())
    try:
        writer = Writer(pool, inline_bytes=1024)
        assert writer.min_bytes == 1024
        asked: list[tuple[int, ...]] = []

        class Counting:
            min_bytes = writer.min_bytes

            def __call__(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray | None:
                asked.append(shape)
                return writer(shape, dtype)

        small = [np.full(8, i, np.float32) for i in range(4)]  # 128 bytes in all
        large = [np.full(256, i, np.float32) for i in range(4)]  # 4 KiB
        with use_allocator(Counting()):
            a = default_collate(small)
            b = default_collate(large)
        assert asked == [(4, 256)]
        assert writer.locate(np.asarray(b).__array_interface__["data"][0], 4096) is not None
        assert writer.locate(np.asarray(a).__array_interface__["data"][0], 128) is None
        np.testing.assert_array_equal(np.asarray(b)[3], np.full(256, 3, np.float32))
        writer.abandon()
    finally:
        pool.close()


def test_a_doorbell_wakes_once_per_ring_burst_and_closes_quietly() -> None:
    from conveyor.executors.task import Doorbell

    bell = Doorbell.make()
    if bell is None:
        pytest.skip("no eventfd here (not Linux)")
    assert not bell.wait(0)
    bell.ring()
    bell.ring()
    assert bell.wait(0)  # rings before the wait add up to one wake-up
    assert not bell.wait(0)  # ... which leaves it silent
    woke: list[bool] = []
    waiter = threading.Thread(target=lambda: woke.append(bell.wait(10.0)))
    waiter.start()
    bell.ring()
    waiter.join(10.0)
    assert woke == [True]
    bell.close()
    bell.close()
    bell.ring()  # after close: nothing, not a write to whatever file reuses the number
    assert bell.fd == -1
