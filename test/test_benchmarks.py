"""`infmllm-bench --quick`, suite by suite: each runs end to end on the embedded model and writes a
table, JSON and a PNG whose contents hold the structural bounds a real run must hold. Timings are
measured, never asserted."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
import torch

BUDGET, CHUNK = 512, 64


def run_quick(suite: str, out, *extra: str) -> dict:
    """The suite as a user runs it, in a process of its own (no model or torch state left in pytest's)."""
    result = subprocess.run([sys.executable, "-m", "infmllm_ros.benchmarks.cli", "--suite", suite, "--quick",
                             "--out", str(out), *extra], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    print(result.stdout)
    payload = json.loads((out / f"{suite}_quick.json").read_text())
    assert (out / f"{suite}_quick.png").stat().st_size > 1000
    assert payload["suite"] == suite and payload["quick"] is True
    return payload


def test_scale_quick_bounded_policies_stay_flat_and_full_grows(tmp_path, capsys):
    payload = run_quick("scale", tmp_path)
    rows = payload["rows"]
    assert {row["policy"] for row in rows} == {"full", "streaming", "h2o", "infmllm", "infmllm+recall"}
    for row in rows:
        assert row["frames"] in (16, 100, 128)
        if row["policy"] != "full":
            assert row["cache_tokens"] <= BUDGET + CHUNK
        assert row["peak_rss_mb"] >= row["rss_mb"] * 0.5 > 0
        assert all(math.isfinite(row[key]) and row[key] > 0 for key in ("ingest_ms", "ttft_ms", "decode_ms"))
    full = [row["cache_tokens"] for row in rows if row["policy"] == "full"]
    assert full == sorted(full) and full[-1] > BUDGET + CHUNK
    # recall keeps what infmllm evicts beside the bounded cache; the policy alone keeps nothing
    assert all(row["store_mb"] == 0.0 for row in rows if row["policy"] != "infmllm+recall")
    assert [row for row in rows if row["policy"] == "infmllm+recall"][-1]["store_mb"] > 0
    ratio = {row["policy"]: row for row in payload["ratios"]}
    assert ratio["full"]["cache_tokens"] > 1.2 and ratio["infmllm"]["cache_tokens"] <= 1.0
    assert "| policy | frames |" in capsys.readouterr().out


def test_quality_quick_reports_accuracy_and_evidence_per_cell(tmp_path):
    rows = run_quick("quality", tmp_path)["rows"]
    assert [row["policy"] for row in rows] == ["full", "streaming", "h2o", "infmllm"]
    full, *bounded = rows
    assert full["kept_long"] == pytest.approx(100.0) and full["kept_recent"] == pytest.approx(100.0)
    for row in rows:
        assert row["n_current"] > 0 and row["n_recent"] > 0
        for key in ("acc_current", "acc_recent", "kept_recent"):
            assert 0.0 <= row[key] <= 100.0
        for family in ("current", "recent"):   # the 95 % interval brackets the rate
            assert row[f"lo_{family}"] <= row[f"acc_{family}"] <= row[f"hi_{family}"]
        assert {"n_distant", "of_full_current", "lo_distant"} <= set(row)
    assert full["of_full_current"] == pytest.approx(100.0)
    for row in bounded:
        assert row["budget"] == int(0.25 * row["stream_tokens"])


def test_recall_quick_sets_infmllm_with_recall_beside_the_policies(tmp_path, capsys):
    rows = run_quick("recall", tmp_path)["rows"]
    assert [row["policy"] for row in rows] == ["full", "infmllm", "infmllm+recall"]   # quick: the pair only
    recall = rows[-1]
    assert 0 < recall["store_mb"] <= 256 and "recall_found_distant" in recall
    assert all(row["ttft_p50_ms"] > 0 for row in rows)
    assert "store_mb" not in rows[-2], "recall figures only where recall ran"
    assert "| policy | share | ttft_p50_ms | store_mb |" in capsys.readouterr().out


def test_saddle_cells_carry_their_settings_to_the_policy():
    from infmllm_ros.benchmarks.measure import make_session
    from infmllm_ros.benchmarks.quality import cell_settings, saddle_cell
    assert cell_settings(saddle_cell(0.05, 3)) == ("infmllm", {"attention_bias": 0.05, "saddle_pool": 3})
    assert cell_settings("h2o") == ("h2o", {}) and cell_settings("infmllm+recall")[0] == "infmllm"
    policy = make_session(None, "infmllm", 256, 64, **cell_settings(saddle_cell(0.1, 1))[1]).policy
    assert (policy.attention_bias, policy.pool) == (0.1, 1)


def test_saddles_quick_sweeps_infmllm_settings(tmp_path, capsys):
    rows = run_quick("saddles", tmp_path)["rows"]
    assert [(row["policy"], row["attention_bias"], row["saddle_pool"]) for row in rows] == [
        ("full", 0.0, 1), ("infmllm bias=0.2 pool=1", 0.2, 1), ("infmllm bias=0 pool=5", 0.0, 5)]
    for row in rows:
        assert row["n_current"] > 0 and row["lo_current"] <= row["acc_current"] <= row["hi_current"]
    assert "| infmllm bias=0.2 pool=1 |" in capsys.readouterr().out


def test_pruning_quick_trades_tokens_per_frame_against_accuracy(tmp_path, capsys):
    rows = run_quick("pruning", tmp_path)["rows"]
    assert [(row["prune_unit"], row["prune_similarity"]) for row in rows] == [("off", 0.0), ("token", 0.99),
                                                                            ("frame", 0.99)]
    off, by_token, by_frame = rows
    assert off["tokens_per_frame"] == 17 and off["kept_pct"] == pytest.approx(100.0)   # the embedded model's frame
    assert 1 <= by_token["tokens_per_frame"] < off["tokens_per_frame"], "some repeated patches left out, text kept"
    assert by_frame["tokens_per_frame"] < off["tokens_per_frame"], "some frames left out whole"
    assert round(by_frame["tokens_per_frame"] * by_frame["frames"]) % 17 == 0, "frames are whole or left out"
    for row in rows:
        assert row["n_current"] > 0 and row["lo_current"] <= row["acc_current"] <= row["hi_current"]
    assert "| setting | prune_unit | threshold | tokens_per_frame |" in capsys.readouterr().out


def test_overhead_quick_measures_every_policy_and_per_token_eviction(tmp_path):
    payload = run_quick("overhead", tmp_path)
    steps = {row["config"]: row for row in payload["steps"]}
    assert set(steps) == {"streaming", "h2o", "h2o per-token", "infmllm"}
    assert steps["h2o per-token"]["cache_tokens"] <= BUDGET + 1
    for row in steps.values():
        assert row["cache_tokens"] <= BUDGET + CHUNK
        assert row["token_evict_ms"] <= row["token_ms"] and row["frame_evict_ms"] <= row["frame_ms"]
    assert {(r["policy"], r["cache_length"]) for r in payload["selection"]} == {
        (p, n) for p in ("streaming", "h2o", "infmllm") for n in (1024, 4096)}


def test_text_quick_scores_every_variant_over_position(tmp_path):
    rows = run_quick("text", tmp_path)["rows"]
    variants = {row["variant"] for row in rows}
    assert variants == {"full", "window (no sinks)", "streaming", "infmllm"}
    for row in rows:
        assert 1.0 < row["ppl"] < 43.0 * 10   # vocabulary of 43 words: far above it means a scoring bug
        if row["variant"] != "full":
            assert row["cache_tokens"] <= 1024 + 256
    assert max(row["to"] for row in rows) == 4096


def test_node_quick_replays_a_30hz_bag_through_dds(tmp_path, ros_environ):
    result = subprocess.run([sys.executable, "-m", "infmllm_ros.benchmarks.cli", "--suite", "node", "--quick",
                             "--out", str(tmp_path / "out"), "--cache-dir", str(tmp_path / "cache")],
                            env=ros_environ, capture_output=True, text=True, timeout=420)
    assert result.returncode == 0, result.stderr[-3000:]
    row = json.loads((tmp_path / "out" / "node_quick.json").read_text())["row"]
    assert row["frames_in_bag"] == 600
    assert 0 < row["fed"] <= row["received"] <= row["frames_in_bag"]
    assert row["skipped"] > 0   # 30 Hz in, 1 Hz of stamp time fed: skipping is the design
    assert row["answered"] + row["refused_or_failed"] + row["unanswered"] == row["questions"] > 0
    assert row["answered"] > 0
    for key in ("observed_p50_ms", "node_p50_ms", "engine_p50_ms", "engine_paced_p50_ms", "node_over_engine_paced_p95",
                "node_cpu_share"):
        assert math.isfinite(row[key]) and row[key] > 0
    assert "| bag_s |" in result.stdout
    for item in row["slow_items"]:   # a slow item's parts never add up to more than its time
        assert item["waited_ms"] + item["worked_ms"] <= item["ms"] + 1.0
    cameras = json.loads((tmp_path / "out" / "node_quick.json").read_text())["two_cameras"]
    for name in ("raw", "jpeg"):   # every frame each camera delivered is accounted for, exactly
        assert cameras[f"{name}_accounted"] and cameras[f"{name}_fed"] > 0
        assert cameras[f"{name}_received"] <= cameras[f"sent_{name}"]
    assert cameras["answered"] + cameras["not_answered"] == cameras["queries"] > 0
    assert all(count > 0 for count in cameras["answered_per_camera"].values())
    assert (tmp_path / "out" / "node_quick_two_cameras_rss.png").stat().st_size > 1000


def test_quality_scored_in_worker_processes_matches_one_process():
    """Episodes scored two at a time in spawned workers give exactly the rows of one process."""
    from infmllm_ros.benchmarks.quality import run_quality
    from infmllm_ros.models import embedded_model_path
    arguments = (str(embedded_model_path()), 2, 24.0, (0.25,), ("streaming", "infmllm"))
    alone = run_quality(*arguments, workers=1)
    pooled = run_quality(*arguments, workers=2)

    def answers_and_evidence(rows):   # timings (ttft_p50_ms) differ between any two runs
        return json.dumps([{k: v for k, v in row.items() if not k.endswith("_ms")} for row in rows], sort_keys=True)
    assert all(row["ttft_p50_ms"] > 0 for row in alone + pooled)
    assert answers_and_evidence(alone) == answers_and_evidence(pooled)   # NaN cells compare too
    assert alone[0]["n_current"] > 0 and alone[1]["budget"] == int(0.25 * alone[1]["stream_tokens"])


def test_realsize_quick_builds_real_shaped_models_and_measures_every_cell(tmp_path):
    from infmllm_ros.benchmarks.realsize import MODELS, MODES, QUICK_SIZE, RUNNERS
    payload = run_quick("realsize", tmp_path / "out", "--cache-dir", str(tmp_path / "cache"))
    for name in MODELS:   # loadable directories, as a user's checkpoint is
        assert (tmp_path / "cache" / "realsize" / f"{name}-quick" / "config.json").is_file()
    assert payload["bandwidth"]["read_gbs"] > 0 and payload["bandwidth"]["copy_gbs"] > 0
    summaries = {(s["model"], s["mode"]): s for s in payload["summaries"]}
    assert set(summaries) == {(name, mode) for name in MODELS for mode in MODES}
    for name in MODELS:
        plain, int8 = summaries[(name, "none")], summaries[(name, "cpu-int8")]
        assert int8["decode_weights_mb"] < 0.5 * plain["decode_weights_mb"]   # int8 decoder weights
        for summary in (plain, int8):
            assert summary["frame_tokens"] > 50 and summary["ingest_ms"] > 0 and summary["ttft_ms"] > 0
            assert "extrapolated" in summary["hour_kv_full_mb"] and "measured" in summary["hour_kv_infmllm_mb"]
            assert summary["linears_ms"] > 0 and summary["weights_floor_ms"] > 0   # timed, not asserted against
    cells = payload["cells"]
    assert len(cells) == len(MODELS) * len(MODES) * len(RUNNERS) * len(QUICK_SIZE.contexts)
    longest = max(QUICK_SIZE.contexts)
    for cell in cells:
        # decode_ms is timed, never asserted (generate()'s is a difference of two timings)
        assert cell["floor_ms"] > 0 and math.isfinite(cell["decode_ms"]) and cell["linears_share_pct"] > 0
        # generate() is what a user runs: transformers' SDPA, not the scoring attention the
        # infmllm session sharing the model left set
        assert cell["attention"] == {"generate": "sdpa", "full": "sdpa", "infmllm": "infmllm_scoring"}[cell["runner"]]
        chunk = max(summaries[(cell["model"], cell["mode"])]["frame_tokens"], 64)   # auto: one frame, >= 64
        if cell["runner"] == "infmllm":   # the bounded cache holds at most budget + one chunk
            assert cell["cache_tokens"] <= QUICK_SIZE.budget + chunk
            assert cell["reserved_mb"] >= cell["kv_mb"]
        else:
            assert cell["cache_tokens"] >= cell["context"]
    for name in MODELS:
        bounded, full = ([c for c in cells if c["model"] == name and c["runner"] == runner and c["context"] == longest]
                         for runner in ("infmllm", "full"))
        assert all(b["kv_mb"] < 0.7 * f["kv_mb"] for b, f in zip(bounded, full))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
@pytest.mark.parametrize("module", ["infmllm_ros.benchmarks.gpu", "infmllm_ros.testing.gpu_check"])
def test_the_gpu_scripts_say_why_they_cannot_run_without_cuda(module):
    done = subprocess.run([sys.executable, "-m", module], capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "CUDA is not available" in done.stdout + done.stderr
    assert "Traceback" not in done.stderr
