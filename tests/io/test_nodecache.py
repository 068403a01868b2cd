"""NodeCache: contents, the limit, pins, Belady vs LRU, one fetch per key across processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zephon_nodes.core.errors import DataError, RecipeError
from zephon_nodes.engine.work import WorkSource
from zephon_nodes.io.nodecache.future import AccessPlan, CacheFeed
from zephon_nodes.io.nodecache.nodecache import (
    LIMIT_ENV,
    CacheFullError,
    NodeCache,
    node_cache,
    parse_size,
    set_cache_limit,
)

ROOT = Path(__file__).resolve().parents[2]


def content(key: str, size: int) -> bytes:
    """The bytes of entry ``key`` (distinct per key, ``size`` long)."""
    unit = (key + "|").encode()
    return (unit * (size // len(unit) + 1))[:size]


def writer(key: str, size: int, log: list[str] | None = None) -> Callable[[Path], None]:
    def fetch(dest: Path) -> None:
        if log is not None:
            log.append(key)
        dest.write_bytes(content(key, size))

    return fetch


def disk_bytes(root: Path) -> int:
    """Bytes physically in the cache: finished entries and partial fetches."""
    return sum(
        e.stat().st_size for sub in ("data", "part") for e in os.scandir(root / sub) if e.is_file()
    )


def run(cache: NodeCache, seq: Sequence[str], size: int = 10) -> None:
    for key in seq:
        with cache.open(key, size, writer(key, size)) as path:
            assert path.read_bytes() == content(key, size)


class TestBeladyVsLru:
    """Miss counts on the textbook sequence, computed by hand (see the comments)."""

    # 1 2 3 4 1 2 5 1 2 3 4 5 with room for 3 entries of 10 bytes.
    SEQ = "123412512345"

    def test_belady_hand_computed(self, tmp_path: Path) -> None:
        """Belady: 7 misses (1 2 3, 4 evicts 3, 5 evicts 4, 3 evicts 1, 4 evicts 2)."""
        cache = NodeCache(tmp_path, 30, "belady")
        cache.set_future(list(self.SEQ))
        run(cache, self.SEQ)
        s = cache.stats()
        assert (s["misses"], s["hits"], s["evictions"]) == (7, 5, 4)
        assert s["bytes_fetched"] == 70
        assert sorted(p.name for p in (tmp_path / "data").iterdir()) == ["3", "4", "5"]
        cache.close()

    def test_lru_hand_computed(self, tmp_path: Path) -> None:
        """LRU: 10 misses (only the 1 2 after 5 hit)."""
        cache = NodeCache(tmp_path, 30, "lru")
        cache.set_future(list(self.SEQ))  # LRU ignores the future
        run(cache, self.SEQ)
        s = cache.stats()
        assert (s["misses"], s["hits"], s["evictions"]) == (10, 2, 7)
        cache.close()

    def test_belady_without_future_still_correct(self, tmp_path: Path) -> None:
        """With no plan every entry ties; contents stay right and the limit holds."""
        cache = NodeCache(tmp_path, 30, "belady")
        run(cache, self.SEQ)
        assert cache.stats()["hits"] + cache.stats()["misses"] == len(self.SEQ)
        assert disk_bytes(tmp_path) <= 30
        cache.close()


def opt_misses(seq: Sequence[str], capacity: int) -> int:
    """Reference optimal (farthest next use) miss count, written independently of the cache."""
    held: set[str] = set()
    misses = 0
    for t, key in enumerate(seq):
        if key in held:
            continue
        misses += 1
        if len(held) >= capacity:
            rest = list(seq[t + 1 :])
            far = {k: rest.index(k) if k in rest else len(seq) + 1 for k in held}
            held.remove(max(sorted(held), key=far.__getitem__))
        held.add(key)
    return misses


class TestProperties:
    """Random sequences, sizes and limits (down to one entry)."""

    @settings(max_examples=20)
    @given(
        seq=st.lists(st.sampled_from("abcdefgh"), min_size=1, max_size=30),
        capacity=st.integers(1, 5),
    )
    def test_uniform_sizes_belady_is_optimal_and_beats_lru(
        self, tmp_path_factory: pytest.TempPathFactory, seq: list[str], capacity: int
    ) -> None:
        """Belady's misses equal the reference optimum and never exceed LRU's."""
        misses = {}
        for policy in ("belady", "lru"):
            root = tmp_path_factory.mktemp(policy)
            cache = NodeCache(root, capacity * 10, policy)  # type: ignore[arg-type]
            cache.set_future(seq)
            run(cache, seq)
            assert disk_bytes(root) <= capacity * 10
            misses[policy] = cache.stats()["misses"]
            cache.close()
        assert misses["belady"] == opt_misses(seq, capacity)
        assert misses["belady"] <= misses["lru"]

    @settings(max_examples=20)
    @given(
        data=st.data(),
        sizes=st.dictionaries(st.sampled_from("abcdef"), st.integers(1, 64), min_size=1),
        policy=st.sampled_from(["belady", "lru"]),
    )
    def test_random_sizes_contents_and_limit(
        self,
        tmp_path_factory: pytest.TempPathFactory,
        data: st.DataObject,
        sizes: dict[str, int],
        policy: str,
    ) -> None:
        """Every open sees its own bytes; the disk never holds more than the limit."""
        keys = sorted(sizes)
        seq = data.draw(st.lists(st.sampled_from(keys), min_size=1, max_size=30))
        limit = data.draw(st.integers(max(sizes.values()), sum(sizes.values())))
        root = tmp_path_factory.mktemp("rand")
        cache = NodeCache(root, limit, policy)  # type: ignore[arg-type]
        cache.set_future(seq)
        seen_during_fetch: list[int] = []
        for key in seq:

            def fetch(dest: Path, key: str = key) -> None:
                dest.write_bytes(content(key, sizes[key]))
                seen_during_fetch.append(disk_bytes(root))

            with cache.open(key, sizes[key], fetch) as path:
                assert path.read_bytes() == content(key, sizes[key])
            assert disk_bytes(root) <= limit
        assert max(seen_during_fetch) <= limit
        assert cache.stats()["peak_bytes"] <= limit
        cache.close()


class TestPins:
    """An entry in use is never evicted; a full cache fails clearly instead of hanging."""

    def test_pinned_entry_survives(self, tmp_path: Path) -> None:
        """Belady would evict "a" (never used again) but it is pinned, so "b" goes."""
        cache = NodeCache(tmp_path, 20, "belady")
        cache.set_future(["a", "b", "c", "b"])
        with cache.open("a", 10, writer("a", 10)) as a:
            run(cache, ["b"])
            run(cache, ["c"])
            assert a.read_bytes() == content("a", 10)
            assert not cache.contains("b")
        assert cache.stats()["evictions"] == 1
        cache.close()

    def test_own_pins_fill_the_cache(self, tmp_path: Path) -> None:
        """The caller's own pins leave no room: CacheFullError at once, naming the limit."""
        cache = NodeCache(tmp_path, 20, "belady", wait_s=30)
        t0 = time.monotonic()
        with (
            cache.open("a", 10, writer("a", 10)),
            cache.open("b", 10, writer("b", 10)),
            pytest.raises(CacheFullError, match="limit_bytes=20"),
            cache.open("c", 10, writer("c", 10)),
        ):
            pass
        assert time.monotonic() - t0 < 5
        assert sorted(p.name for p in (tmp_path / "data").iterdir()) == ["a", "b"]
        assert list((tmp_path / "part").iterdir()) == []
        assert list((tmp_path / "resv").iterdir()) == []
        cache.close()

    def test_larger_than_limit(self, tmp_path: Path) -> None:
        """An entry larger than the whole limit is refused with both numbers."""
        cache = NodeCache(tmp_path, 5, "lru")
        with (
            pytest.raises(CacheFullError, match=r"needs 10 bytes.*limit_bytes=5"),
            cache.open("a", 10, writer("a", 10)),
        ):
            pass
        cache.close()

    def test_other_thread_pins_wait_then_proceed(self, tmp_path: Path) -> None:
        """Pins held by another thread make an open wait, then succeed once released."""
        cache = NodeCache(tmp_path, 10, "belady", wait_s=30)
        pinned, release = threading.Event(), threading.Event()

        def hold() -> None:
            with cache.open("a", 10, writer("a", 10)):
                pinned.set()
                release.wait(10)

        t = threading.Thread(target=hold)
        t.start()
        pinned.wait(10)
        threading.Timer(0.2, release.set).start()
        run(cache, ["b"])
        t.join()
        assert cache.stats()["waits"] == 1
        assert not cache.contains("a")
        cache.close()

    def test_other_thread_pins_time_out(self, tmp_path: Path) -> None:
        """If the pins are never released, the wait ends after wait_s with CacheFullError."""
        cache = NodeCache(tmp_path, 10, "belady", wait_s=0.3)
        pinned, release = threading.Event(), threading.Event()

        def hold() -> None:
            with cache.open("a", 10, writer("a", 10)):
                pinned.set()
                release.wait(10)

        t = threading.Thread(target=hold)
        t.start()
        pinned.wait(10)
        try:
            with pytest.raises(CacheFullError, match=r"after waiting 0\.3 s"):
                run(cache, ["b"])
        finally:
            release.set()
            t.join()
        cache.close()


class TestFetching:
    """Fetch failures, growing entries, concurrent wants and a smaller limit."""

    def test_failed_fetch_leaves_nothing(self, tmp_path: Path) -> None:
        """A fetch that raises leaves no entry, reservation or partial file; a retry works."""
        cache = NodeCache(tmp_path, 100)

        def broken(dest: Path) -> None:
            dest.write_bytes(b"half")
            raise DataError("s3://b/k: connection reset")

        with pytest.raises(DataError, match="connection reset"), cache.open("k", 10, broken):
            pass
        assert [list((tmp_path / d).iterdir()) for d in ("data", "part", "resv")] == [[]] * 3
        run(cache, ["k"])
        cache.close()

    def test_entry_larger_than_reserved(self, tmp_path: Path) -> None:
        """An entry bigger than its reservation gets room if there is some, else fails."""
        cache = NodeCache(tmp_path, 25)
        with cache.open("a", 5, writer("a", 20)) as p:
            assert p.read_bytes() == content("a", 20)
        with (
            pytest.raises(CacheFullError, match="more than the 5 bytes reserved"),
            cache.open("b", 5, writer("b", 30)),
        ):
            pass
        assert not cache.contains("b")
        cache.close()

    def test_threads_fetch_a_key_once(self, tmp_path: Path) -> None:
        """Eight threads open the same key at once: one fetch, everyone reads it."""
        cache = NodeCache(tmp_path, 100)
        log: list[str] = []
        barrier = threading.Barrier(8)
        errors: list[BaseException] = []

        def slow(dest: Path) -> None:
            log.append("k")
            time.sleep(0.05)
            dest.write_bytes(content("k", 50))

        def worker() -> None:
            try:
                barrier.wait(10)
                with cache.open("k", 50, slow) as p:
                    assert p.read_bytes() == content("k", 50)
            except BaseException as exc:  # reported below
                errors.append(exc)

        threads = [threading.Thread(target=worker) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        assert log == ["k"]
        s = cache.stats()
        assert (s["misses"], s["hits"], s["fetches"]) == (1, 7, 1)
        cache.close()

    def test_dead_fetcher_leaves_no_reservation(self, tmp_path: Path) -> None:
        """A reservation and partial file whose fetcher died (no lock held) are cleared."""
        cache = NodeCache(tmp_path, 100)
        (tmp_path / "resv" / "x").write_text("1000000")
        (tmp_path / "part" / "x.999-dead.tmp").write_bytes(b"half")
        run(cache, ["y"])
        assert list((tmp_path / "resv").iterdir()) == []
        assert list((tmp_path / "part").iterdir()) == []
        cache.close()

    def test_stuck_fetch_times_out(self, tmp_path: Path) -> None:
        """Waiting for another fetcher of the same key ends after wait_s with a DataError."""
        cache = NodeCache(tmp_path, 100, wait_s=0.3)
        started, release = threading.Event(), threading.Event()

        def stuck(dest: Path) -> None:
            started.set()
            release.wait(10)
            dest.write_bytes(b"late")

        def first() -> None:
            with cache.open("k", 10, stuck):
                pass

        t = threading.Thread(target=first)
        t.start()
        started.wait(10)
        try:
            with pytest.raises(DataError, match=r"'k' has been fetched by another process"):
                run(cache, ["k"])
        finally:
            release.set()
            t.join()
        cache.close()

    def test_smaller_limit_trims(self, tmp_path: Path) -> None:
        """Reopening with a smaller limit evicts down to it at once."""
        run(NodeCache(tmp_path, 100), ["a", "b", "c", "d"])
        assert disk_bytes(tmp_path) == 40
        cache = NodeCache(tmp_path, 25)
        assert disk_bytes(tmp_path) <= 25
        cache.close()

    def test_unsafe_keys(self, tmp_path: Path) -> None:
        """Keys that are not file names (URIs, slashes) work and stay distinct."""
        cache = NodeCache(tmp_path, 100)
        keys = ["s3://bucket/a/b.jsonl", "s3://bucket/a/c.jsonl", "../x", ""]
        cache.set_future(keys)
        run(cache, keys)
        assert cache.stats()["misses"] == 4
        run(cache, keys)
        assert cache.stats()["hits"] == 4
        cache.close()


class TestPrefetch:
    """The background prefetcher fetches the future ahead of use, and stops at close."""

    def test_prefetch_turns_misses_into_hits(self, tmp_path: Path) -> None:
        """Keys prefetched before their open are hits; each is fetched once."""
        log: list[str] = []
        cache = NodeCache(tmp_path, 1000)  # a quarter holds 25 entries of 10 bytes
        seq = [f"k{i}" for i in range(6)]
        cache.start_prefetch(lambda key: (10, writer(key, 10, log)), depth=6)
        cache.set_future(seq)
        deadline = time.monotonic() + 10
        while len(log) < 6 and time.monotonic() < deadline:
            time.sleep(0.01)
        run(cache, seq)
        s = cache.stats()
        assert (s["hits"], s["misses"], s["prefetches"]) == (6, 0, 6)
        assert sorted(log) == seq
        cache.close()

    def test_prefetch_evicts_only_unplanned(self, tmp_path: Path) -> None:
        """A full cache: prefetching v and w evicts g and h (never needed), nothing else."""
        log: list[str] = []
        cache = NodeCache(tmp_path, 80)
        run(cache, list("pqrstugh"))
        cache.start_prefetch(lambda key: (10, writer(key, 10, log)), depth=8)
        cache.set_future(list("vpqrstuw"))
        deadline = time.monotonic() + 10
        while len(log) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.1)
        assert log == ["v", "w"]
        assert sorted(p.name for p in (tmp_path / "data").iterdir()) == list("pqrstuvw")
        cache.close()

    def test_prefetch_keeps_planned(self, tmp_path: Path) -> None:
        """If every cached entry is planned (even after the candidate), nothing happens."""
        log: list[str] = []
        cache = NodeCache(tmp_path, 80)
        run(cache, list("pqrstugh"))
        cache.start_prefetch(lambda key: (10, writer(key, 10, log)), depth=9)
        cache.set_future(list("vpqrstugh"))
        time.sleep(0.3)
        assert log == []
        assert cache.stats()["evictions"] == 0
        cache.close()

    def test_prefetch_bounded_to_a_quarter(self, tmp_path: Path) -> None:
        """At most a quarter of the limit waits for its first use: 2 of 8 upcoming keys."""
        log: list[str] = []
        cache = NodeCache(tmp_path, 80)
        cache.start_prefetch(lambda key: (10, writer(key, 10, log)), depth=8)
        cache.set_future(list("abcdefgh"))
        time.sleep(0.3)
        assert log == ["a", "b"]
        run(cache, ["a"])  # used: one more may come
        time.sleep(0.3)
        assert log == ["a", "b", "c"]
        cache.close()


class TestConfiguration:
    """ZEPHON_CACHE_LIMIT / set_cache_limit and size parsing."""

    def test_parse_size(self) -> None:
        """Suffixes are powers of 1024."""
        assert parse_size("512") == 512
        assert parse_size("2K") == 2048
        assert parse_size("1.5M") == 3 << 19
        assert parse_size("50GiB") == 50 << 30
        assert parse_size("1tb") == 1 << 40
        with pytest.raises(ValueError, match="'lots'"):
            parse_size("lots")

    def test_node_cache_from_env(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """No limit: the default one; a limit: one shared instance under $ZEPHON_CACHE_DIR/node."""
        monkeypatch.setenv("ZEPHON_CACHE_DIR", str(tmp_path))
        monkeypatch.delenv(LIMIT_ENV, raising=False)
        default = node_cache()
        assert 0 < default.limit_bytes <= 100 << 30  # a share of the free disk, capped
        set_cache_limit("1M", "lru")
        cache = node_cache()
        assert cache is not None and cache is node_cache()
        assert (cache.limit_bytes, cache.policy, cache.root) == (1 << 20, "lru", tmp_path / "node")
        monkeypatch.setenv(LIMIT_ENV, "many")
        with pytest.raises(RecipeError, match=r"ZEPHON_CACHE_LIMIT.*'many'"):
            node_cache()
        with pytest.raises(RecipeError, match="'fifo'"):
            set_cache_limit("1M", "fifo")
        monkeypatch.delenv(LIMIT_ENV)
        set_cache_limit(None)
        assert node_cache() is default


_PROC = textwrap.dedent(
    """
    import os, sys, time, types
    from pathlib import Path

    # The package root imports torch (seconds per process); the cache needs none of it.
    pkg = types.ModuleType("zephon_nodes")
    pkg.__path__ = [os.path.join(os.environ["PYTHONPATH"], "zephon_nodes")]
    sys.modules["zephon_nodes"] = pkg
    from zephon_nodes.io.nodecache.nodecache import NodeCache

    root, log, go, rank = sys.argv[1], sys.argv[2], Path(sys.argv[3]), int(sys.argv[4])
    keys = [f"shard-{i:02d}" for i in range(12)]
    keys = keys[rank % 2 * 6:] + keys[:rank % 2 * 6]  # two pairs, each in lockstep
    cache = NodeCache(root, 10_000, "belady", wait_s=60)
    cache.set_future(keys)
    Path(str(go) + f".ready-{rank}").touch()  # the test releases all four at once
    while not go.exists():
        time.sleep(0.005)
    for key in keys:
        def fetch(dest, key=key):
            fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
            os.write(fd, (key + "\\n").encode())
            os.close(fd)
            time.sleep(0.02)
            dest.write_bytes(key.encode() * 100)
        with cache.open(key, 800, fetch) as p:
            assert p.read_bytes() == key.encode() * 100, key
    print(cache.stats()["misses"], cache.stats()["hits"], cache.stats()["waits"])
    """
)


def test_four_processes_fetch_each_key_once(tmp_path: Path) -> None:
    """Four processes sharing one directory want the same 12 keys: each is fetched once."""
    script = tmp_path / "rank.py"
    script.write_text(_PROC)
    log, go = tmp_path / "fetches.log", tmp_path / "go"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(tmp_path / "cache"), str(log), str(go), str(r)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for r in range(4)
    ]
    # Release the four together once every one is ready (imports take seconds under load),
    # so pairs in lockstep do want the same key at the same time.
    deadline = time.monotonic() + 120
    while not all(Path(f"{go}.ready-{r}").exists() for r in range(4)):
        assert time.monotonic() < deadline, "the rank processes did not start"
        assert all(p.poll() is None for p in procs), [p.communicate() for p in procs]
        time.sleep(0.01)
    go.touch()
    outs = [p.communicate(timeout=120) for p in procs]
    for p, (_out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err.decode()
    fetched = log.read_text().split()
    assert sorted(fetched) == [f"shard-{i:02d}" for i in range(12)]
    misses = sum(int(out.split()[0]) for out, _ in outs)
    hits = sum(int(out.split()[1]) for out, _ in outs)
    assert (misses, hits) == (12, 36)
    assert sum(int(out.split()[2]) for out, _ in outs) > 0  # some opens did wait for a fetch


class _Shard:
    """A cacheable shard stand-in (or, with ``key=None``, one read in place)."""

    def __init__(self, key: str | None) -> None:
        if key is not None:
            self.cache_key = key
        self.cache_size = 10

    def cache_fetch(self, dest: Path) -> None:
        dest.write_bytes(content(self.cache_key, 10))


class _Item:
    def __init__(self, shard: _Shard) -> None:
        self.shard = shard


class _Source(WorkSource):
    """Lane 0 reads shards a b c d, lane 1 reads x (in place) y z; then both end."""

    def __init__(self) -> None:
        super().__init__(num_lanes=2)
        self.STREAMS = {0: ["a", "b", "c", "d"], 1: [None, "y", "z"]}

    def work(self, lane: int, i: int) -> Any:
        stream = self.STREAMS[lane]
        return _Item(_Shard(stream[i])) if i < len(stream) else None


class TestAccessPlan:
    """The future of several lanes, round-robin from their positions."""

    def test_round_robin_from_positions(self) -> None:
        """Lane 0 from item 1 (item 1 in flight), lane 1 from item 0; in-place reads skipped."""
        plan = AccessPlan(_Source())  # type: ignore[arg-type]
        assert plan.update({0: 1, 1: 0}, {0: 2, 1: 0})
        # t=0: lane0 b (in flight), lane1 x (in place); t=1: c, y; t=2: d, z.
        assert plan.keys() == (["b", "c", "y", "d", "z"], [0])
        assert not plan.update({0: 1, 1: 0}, {0: 2, 1: 0})
        plan.horizon = 2
        assert plan.keys() == (["b", "c"], [0])

    @settings(max_examples=60, deadline=None)
    @given(
        streams=st.lists(
            st.lists(st.sampled_from(["a", "b", "c", None]), max_size=12), min_size=1, max_size=4
        ),
        moves=st.lists(st.tuples(st.integers(0, 14), st.integers(0, 3)), min_size=1, max_size=30),
        horizon=st.integers(1, 9),
    )
    def test_keys_after_any_moves_are_those_of_the_items(
        self, streams: list[list[str | None]], moves: list[tuple[int, int]], horizon: int
    ) -> None:
        """Positions moving forward and back: keys() lists what items() yields, in order."""
        source = _Source()
        source.STREAMS = dict(enumerate(streams))
        source.num_lanes = len(streams)
        plan = AccessPlan(source, horizon)  # type: ignore[arg-type]
        for k, (start, ahead) in enumerate(moves):
            lanes = range(len(streams))
            plan.update(
                {lane: (start + lane * k) % 15 for lane in lanes},
                {lane: (start + lane * k) % 15 + ahead for lane in lanes},
            )
            expected: tuple[list[str], list[int]] = ([], [])
            for scanned, (item, flying) in enumerate(plan.items(), 1):  # the reference
                key = getattr(item.shard, "cache_key", None)
                if key is not None:
                    if flying:
                        expected[1].append(len(expected[0]))
                    expected[0].append(key)
                    if len(expected[0]) >= horizon:
                        break
                if scanned >= 8 * horizon:
                    break
            assert plan.keys() == expected

    def test_each_work_item_is_looked_up_once(self) -> None:
        """Recomputing the future after a step reads the work source for new items only."""
        calls: list[tuple[int, int]] = []
        source = _Source()
        work = source.work

        def counted(lane: int, i: int) -> Any:
            calls.append((lane, i))
            return work(lane, i)

        source.work = counted  # type: ignore[method-assign]
        plan = AccessPlan(source)  # type: ignore[arg-type]
        plan.update({0: 0, 1: 0})
        assert plan.keys() == (["a", "b", "y", "c", "z", "d"], [])
        plan.update({0: 1, 1: 0}, {0: 2, 1: 0})
        assert plan.keys() == (["b", "c", "y", "d", "z"], [0])
        assert sorted(calls) == sorted(set(calls)), calls

    def test_feed_drives_eviction_and_prefetch(self, tmp_path: Path) -> None:
        """The feed's plan makes the cache keep the sooner key and prefetch the next one."""
        cache = NodeCache(tmp_path, 100)  # a quarter holds 2 entries
        feed = CacheFeed(cache, _Source(), prefetch=2)  # type: ignore[arg-type]
        feed.update({0: 0, 1: 1}, {0: 1, 1: 1})  # a in flight; then y, b, z, c, d
        deadline = time.monotonic() + 10
        while cache.stats()["prefetches"] < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert cache.contains("y") and cache.contains("b") and not cache.contains("a")
        cache.close()


class TestSharedPlans:
    """Processes on a node see each other's plans (here: two instances, two lock owners)."""

    def test_other_plan_protects_its_entries(self, tmp_path: Path) -> None:
        """B must evict: z goes (no one plans it); x stays because A plans it next."""
        a, b = NodeCache(tmp_path, 30), NodeCache(tmp_path, 30)
        run(b, ["x", "y", "z"])
        a.set_future(["x"])
        b.set_future(["w", "y"])
        run(b, ["w"])
        assert sorted(p.name for p in (tmp_path / "data").iterdir()) == ["w", "x", "y"]
        a.close()  # A's plan is withdrawn: x is now the only unplanned entry
        b.set_future(["v", "w", "y"])
        run(b, ["v"])
        assert sorted(p.name for p in (tmp_path / "data").iterdir()) == ["v", "w", "y"]
        b.close()

    def test_dead_plan_is_ignored_and_removed(self, tmp_path: Path) -> None:
        """A plan file nobody holds (its process died) protects nothing and is deleted."""
        cache = NodeCache(tmp_path, 20)
        run(cache, ["x", "y"])
        stale = tmp_path / "plan" / "12345-dead.json"
        stale.write_text(json.dumps(["x", "y"]))
        cache.set_future(["z", "y"])
        run(cache, ["z"])
        assert sorted(p.name for p in (tmp_path / "data").iterdir()) == ["y", "z"]
        assert not stale.exists()
        cache.close()
