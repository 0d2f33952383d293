"""Collector pauses are timed per generation, and freezing the loaded heap takes it out of them."""

from __future__ import annotations

import gc

from infmllm_ros.ros.gc_pauses import GcPauses, freeze_loaded_heap, unfreeze_heap


def test_pauses_are_timed_per_generation_and_the_callback_is_removed():
    pauses = GcPauses()
    pauses.install()
    pauses.install()   # idempotent: one callback however often the node configures
    try:
        assert gc.callbacks.count(pauses._callback) == 1
        gc.disable()   # only the collections asked for below
        gc.collect(0)
        gc.collect(2)
        gc.collect(2)
        with pauses.deliberate():
            gc.collect(2)   # the node's own collections (freeze, cleanup) are not pauses it suffers
        summary = pauses.summary()
    finally:
        gc.enable()
        pauses.remove()
    assert pauses._callback not in gc.callbacks
    assert summary["gen0"]["count"] == 1 and summary["gen1"]["count"] == 0 and summary["gen2"]["count"] == 2
    assert summary["gen2"]["max_ms"] is not None and summary["gen1"]["max_ms"] is None


def test_a_frozen_heap_is_skipped_by_full_collections_and_unfrozen_again():
    garbage = [[index] for index in range(200_000)]   # a heap worth walking, as a loaded model's is
    try:
        frozen = freeze_loaded_heap()
        assert frozen >= 200_000 and gc.get_freeze_count() == frozen
        # the oldest generation, which a full collection walks, no longer holds the frozen objects
        assert not any(obj is garbage for obj in gc.get_objects(generation=2))
    finally:
        unfreeze_heap()
    gc.collect()
    assert gc.get_freeze_count() == 0
    assert any(obj is garbage for obj in gc.get_objects(generation=2))   # collectable again


def test_the_summary_never_counts_the_frozen_generation(monkeypatch):
    """Counting walks every frozen object (~35 ms for a loaded model, holding the GIL): the stats timer
    reports the count recorded at freezing instead."""
    pauses = GcPauses()
    pauses.frozen_objects = 380_176

    def walks_the_heap():
        raise AssertionError("summary() walked the frozen generation")
    monkeypatch.setattr(gc, "get_freeze_count", walks_the_heap)
    assert pauses.summary()["frozen_objects"] == 380_176


def test_total_pause_time_adds_up_every_recorded_pause():
    pauses = GcPauses()
    pauses.install()
    try:
        gc.disable()
        gc.collect(2)
        gc.collect(0)
        with pauses.deliberate():
            gc.collect(2)
        total = pauses.total_s
    finally:
        gc.enable()
        pauses.remove()
    recorded = [s for samples in pauses._samples for s in samples]
    assert len(recorded) == 2 and abs(total - sum(recorded)) < 1e-12 and total > 0
