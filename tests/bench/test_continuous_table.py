"""bench.perf.continuous's table: each continuous row against static batching with as many rows and against the
recipe's own static batch, and the rate of decoding alone beside the useful-tokens rate; `--render` rewrites a
results file's table from its raw rows."""

import json

from bench.perf.continuous import main, table


def _row(batching: str, repeat: int, tokens: int, wall_s: float, generate_s: float, slots: int | None = None) -> dict:
    return {"recipe": "r", "repeat": repeat, "slots": slots, "batching": batching, "seed": repeat, "groups": 2,
            "tokens": tokens, "wall_s": wall_s, "tokens_per_s": tokens / wall_s, "sampled_tokens": tokens,
            "sampled_tokens_per_s": tokens / wall_s, "generate_s": generate_s, "row_waste": 0.0,
            "capacity_waste": 0.5, "decode_steps": 10, "length_median": 5, "length_p90": 9, "length_max": 10}


ROWS = [_row("static", 0, 100, 10.0, 5.0), _row("continuous", 0, 120, 10.0, 4.0),
        _row("static", 1, 100, 10.0, 5.0), _row("continuous", 1, 110, 10.0, 5.0)]


def test_the_decoding_only_ratio_leaves_out_what_both_batchings_share():
    continuous = table(ROWS).splitlines()[3].split(" | ")
    assert continuous[2:5] == ["11.5", "1.15×", "1.10×"]  # useful tokens/s: 120/10 and 110/10 against 100/10
    assert continuous[-2] == "26.0, 1.30×; 1.10×"  # decoding only: 120/4 ÷ 100/5 = 1.5, 110/5 ÷ 100/5 = 1.1
    assert continuous[-1] == "1.15×; 1.10× |"  # the recipe's own static batch is the one with as many rows here


def test_a_larger_batch_is_also_compared_with_the_recipes_own_static_batch():
    wide = [_row("static", r, 150, 10.0, 5.0, slots=48) for r in (0, 1)] + [
        _row("continuous", 0, 160, 10.0, 5.0, slots=48), _row("continuous", 1, 140, 10.0, 5.0, slots=48)]
    lines = table(ROWS + wide).splitlines()
    static48, continuous48 = (line.split(" | ") for line in lines[4:6])
    assert continuous48[1:4] == ["continuous, 48 slots", "15.0", "1.00×"]  # 160/150 and 140/150: median 1.00
    assert continuous48[-1] == "1.50×; 1.40× |"  # 160/100 and 140/100 against the recipe's own 24-row batch
    assert static48[-1] == "1.50×; 1.50× |"
    assert table([r for r in wide if r["slots"]]).splitlines()[2].endswith("| — |")  # --only-slots: no own batch


def test_render_rewrites_the_table_from_the_raw_rows_and_keeps_the_header(tmp_path):
    path = tmp_path / "result.md"
    head = "# bench/perf/continuous.py\n\n- date: 2026-01-01\n- command: `python -m bench.perf.continuous`\n\n"
    path.write_text(head + "| recipe | old table |\n|---|---|\n\n```json\n" + json.dumps(ROWS) + "\n```\n")
    for _ in range(2):  # a second render changes nothing
        main(["--render", str(path)])
        text = path.read_text()
        assert text.startswith(head.rstrip("\n") + "\n- table re-rendered from the raw rows")
        assert text.count("re-rendered") == 1 and "old table" not in text
        assert table(ROWS) in text
        assert json.loads(text[text.index("```json") + 7:text.rindex("```")]) == ROWS
