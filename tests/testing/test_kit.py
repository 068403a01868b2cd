"""The property-test kit catches wrong operators and passes correct ones."""

from __future__ import annotations

import re

import pytest
from hypothesis import strategies as st

from tests.testing import wrong_ops
from zephon_nodes import DatasetSpec, Pipeline, Recipe, ShuffleSpec, TokenizerSpec, WorkSpec
from zephon_nodes.operators import ConcatPacker, ShuffleBuffer, Tokenize
from zephon_nodes.operators.chain import Chain
from zephon_nodes.testing import (
    assert_elastic,
    assert_flush_replay_exact,
    assert_state_roundtrip,
    assert_worker_invariant,
    list_source,
)
from zephon_nodes.testing import strategies as zst


class TestWorkerInvariant:
    def test_a_pure_operator_passes(self) -> None:
        assert_worker_invariant(wrong_ops.Reverse())

    def test_the_library_tokenizer_passes(self) -> None:
        assert_worker_invariant(Tokenize(TokenizerSpec(kind="bytes")), zst.text_batches())

    def test_an_operator_that_reads_the_worker_id_is_caught(self) -> None:
        with pytest.raises(AssertionError, match="not worker-invariant") as e:
            assert_worker_invariant(wrong_ops.WorkerTag())
        # the minimal counterexample: one input, the first one
        assert "input #0 of 1" in str(e.value)

    def test_an_operator_that_reads_the_thread_identity_is_caught(self) -> None:
        with pytest.raises(AssertionError, match="'thread-identity' is not worker-invariant"):
            assert_worker_invariant(wrong_ops.ThreadIdentity())

    def test_an_operator_with_a_counter_is_caught(self) -> None:
        with pytest.raises(AssertionError, match="'counting' is not worker-invariant"):
            assert_worker_invariant(wrong_ops.Counting())

    @pytest.mark.slow
    def test_the_process_runner(self) -> None:
        assert_worker_invariant(
            wrong_ops.Reverse(), workers=(2,), runners=("process",), max_examples=5
        )
        with pytest.raises(AssertionError, match="does not pickle"):
            assert_worker_invariant(wrong_ops.Unpicklable(), workers=(1,), runners=("process",))


class TestFlushReplay:
    def test_a_correct_accumulator_passes(self) -> None:
        assert_flush_replay_exact(wrong_ops.make_chunk_packer)

    def test_the_library_packer_and_shuffle_pass(self) -> None:
        assert_flush_replay_exact(lambda w: ConcatPacker(5, 0))
        assert_flush_replay_exact(lambda w: ShuffleBuffer(3, 11, 0, w), st.integers(0, 99))

    def test_state_kept_across_a_flush_is_caught(self) -> None:
        with pytest.raises(AssertionError, match="not flush/replay exact") as e:
            assert_flush_replay_exact(wrong_ops.make_carry_over())
        assert "keep state across a flush" in str(e.value)

    def test_a_counter_shared_by_windows_is_caught(self) -> None:
        with pytest.raises(AssertionError, match="not flush/replay exact"):
            assert_flush_replay_exact(wrong_ops.make_shared_counter())


class TestStateRoundtrip:
    def test_a_copying_get_state_passes(self) -> None:
        assert_state_roundtrip(wrong_ops.RunningSum(list_source(list(range(9)), 2), live=False))

    def test_a_live_buffer_is_caught(self) -> None:
        node = wrong_ops.RunningSum(list_source(list(range(9)), 2), live=True)
        with pytest.raises(AssertionError, match="get_state\\(\\) returned a live object") as e:
            assert_state_roundtrip(node)
        # the earliest position whose state changed later
        assert "before output #0" in str(e.value)

    def test_a_node_factory_restores_into_a_new_instance(self) -> None:
        assert_state_roundtrip(lambda: wrong_ops.RunningSum(list_source([1, 2, 3], 1), False))

    def test_an_accumulator_factory_is_wrapped(self) -> None:
        assert_state_roundtrip(wrong_ops.make_chunk_packer)

    def test_a_wrong_accumulator_factory_is_caught(self) -> None:
        with pytest.raises(AssertionError, match=r"does not reproduce|live object"):
            assert_state_roundtrip(wrong_ops.make_shared_counter())

    def test_a_state_that_is_not_json_safe_is_caught(self) -> None:
        class TupleState(wrong_ops.RunningSum):
            def get_state(self):  # type: ignore[no-untyped-def]
                return {"source": self.source.get_state(), "seen": tuple(self._seen)}

        with pytest.raises(AssertionError, match="changes in a JSON round trip"):
            assert_state_roundtrip(TupleState(list_source([1, 2, 3], 1), live=False))


def small_recipe(**kw: object) -> Recipe:
    texts = [f"document {i} " + "lorem ipsum " * (i % 7) for i in range(90)]
    base: dict = dict(
        datasets=(DatasetSpec("m", records=tuple({"text": t} for t in texts)),),
        tokenizer=TokenizerSpec(kind="bytes"),
        seed=3,
        num_lanes=4,
        global_batch_size=8,
        seq_len=32,
        flush_every=3,
        work=WorkSpec(chunk_size=5, epochs=1),
        shuffle=ShuffleSpec(4),
    )
    base.update(kw)
    return Recipe(**base)  # type: ignore[arg-type]


class TestElastic:
    def test_a_recipe_passes(self) -> None:
        assert_elastic(small_recipe(), steps=6)

    def test_a_pipeline_with_a_thread_dependent_operator_fails(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        real_init = Pipeline.__init__

        def init(self: Pipeline, recipe: Recipe) -> None:
            real_init(self, recipe)
            self.stateless = Chain([*self.stateless.operators, wrong_ops.WorkerTag()])

        monkeypatch.setattr(Pipeline, "__init__", init)
        with pytest.raises(AssertionError, match="not elastically deterministic") as e:
            assert_elastic(small_recipe(), steps=4, dp_sizes=[1, 2])
        # the smallest failing setting is named first, with its first differing step
        assert re.search(r": dp=1 workers=2 thread: step 1 differs", str(e.value))


class TestStrategies:
    def test_world_sizes_divide_the_lanes(self) -> None:
        from hypothesis import given

        @given(zst.lane_counts().flatmap(lambda n: st.tuples(st.just(n), zst.world_sizes(n))))
        def check(pair: tuple[int, int]) -> None:
            lanes, world = pair
            assert lanes % world == 0 and world <= 8

        check()

    def test_recipes_are_valid_and_elastic(self) -> None:
        from hypothesis import assume, given, settings

        from zephon_nodes import simulate

        @settings(max_examples=3)
        @given(zst.recipes())
        def check(recipe: Recipe) -> None:
            assert recipe.global_batch_size % recipe.num_lanes == 0
            # a recipe over a few tiny documents may not fill one global batch
            assume(any(True for _ in simulate(Pipeline(recipe), 1, 1, num_workers=0)))
            assert_elastic(recipe, steps=3, workers=(0,), dp_sizes=[1, recipe.num_lanes])

        check()
