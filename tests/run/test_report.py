"""`tba report`: every figure lands as a PNG and inline (base64) in one report.html, with a header row per run;
several runs share the figures; a killed run (no summary.json, last line cut) is reported as incomplete; a path
that is not a run dir is refused with a message. Synthetic metrics only — no training."""

import base64
import html
import json
import re
from pathlib import Path

import pytest

from tba.cli import main
from tba.run.report import FIGURES, report

PNG = b"\x89PNG"


def write_run(path, steps=30, finished=True, truncated=False, score0=0.25, extra=None):
    path.mkdir(parents=True)
    lines = []
    for s in range(1, steps + 1):
        row = {"step": s, "wall_clock_s": 10.0 + 0.5 * s, "trainer/loss": 5.0 / s, "trainer/grad_norm": 10.0 / s,
               "trainer/beta": 0.05, "trainer/tokens_per_s": 1000.0 + s, "trainer/busy_fraction": 0.9,
               "trainer/logp_mean": -1.0, "trainer/log_ratio_mean": 0.0,
               "searcher/reward_mean": None if s % 3 == 0 else 0.1 + 0.02 * s, "searcher/busy_fraction": 0.95,
               "searcher/tokens": 500, "searcher/generate_s": 1.0, "buffer/size": 10 * s, "buffer/age_mean": s / 2,
               "buffer/online_fraction": 0.75, "staleness/mean": 1.5, "staleness/max": 4.0, **(extra or {})}
        if s % 10 == 0:
            row["eval/score"] = score0 + s / 100
        lines.append(json.dumps(row))
    text = "\n".join(lines) + "\n"
    if truncated:
        text += json.dumps({"step": steps + 1, "trainer/loss": 1.0})[:25]  # killed mid-write
    (path / "metrics.jsonl").write_text(text)
    (path / "config.yaml").write_text("objective: tb\nruntime: local\nmode: async\nseed: 7\n")
    if finished:
        evals = [[0, score0, 0.0]] + [[s, score0 + s / 100, s * 0.5] for s in range(10, steps + 1, 10)]
        (path / "summary.json").write_text(json.dumps({
            "score_start": score0, "score_end": evals[-1][1], "evals": evals, "objective": "tb", "runtime": "local",
            "mode": "async", "seed": 7, "wall_clock_s": 10.0 + 0.5 * steps + 3, "trainer_steps": steps}))
    return path


def payloads(page):
    srcs = re.findall(r"<img[^>]*\ssrc='([^']*)'", page.read_text())
    assert all(s.startswith("data:image/png;base64,") for s in srcs)
    return [base64.b64decode(s.split(",", 1)[1]) for s in srcs]


def table_rows(page):
    return re.findall(r"<tr>(<td>.*?)</tr>", page.read_text(), flags=re.S)


def test_one_run_writes_every_figure_inline_with_its_name_and_scores(tmp_path):
    run = write_run(tmp_path / "my_run", extra={"trainer/log_z_mean": 2.0, "trainer/residual_mean": 0.1,
                                                "trainer/residual_std": 0.3})
    page = report([run], tmp_path / "out")
    assert page == tmp_path / "out" / "report.html"
    for fname, _, _ in FIGURES:
        assert (tmp_path / "out" / fname).read_bytes().startswith(PNG)
    images = payloads(page)
    assert len(images) == len(FIGURES) and all(b.startswith(PNG) for b in images)
    text = page.read_text()
    assert text.count("data:image/png;base64,") == len(FIGURES)
    assert "my_run" in text and "0.250 → 0.550" in text and "finished" in text
    assert "src='http" not in text and "<script" not in text  # self-contained
    assert "train 1,016 tok/s" in text and "MFU" not in text.split("<h2>")[0]  # no mfu logged: none shown


def test_the_header_gives_the_median_throughput(tmp_path):
    run = write_run(tmp_path / "r", extra={"searcher/tokens_per_s": 250.0, "trainer/mfu": 0.0123})
    text = report([run], tmp_path / "out").read_text()
    assert "train 1,016 tok/s · search 250 tok/s · MFU 1.2%" in text


def test_cli_default_out_is_run_dir_report(tmp_path, capsys):
    run = write_run(tmp_path / "r")
    assert main(["report", str(run)]) == 0
    assert (run / "report" / "report.html").is_file()
    assert capsys.readouterr().out.strip().endswith(str(run / "report" / "report.html"))


def test_two_runs_are_overlaid_with_a_row_each(tmp_path):
    a = write_run(tmp_path / "run_a", score0=0.2)
    b = write_run(tmp_path / "run_b", steps=20, score0=0.4)
    out = tmp_path / "cmp"
    assert main(["report", str(a), str(b), "--out", str(out)]) == 0
    rows = table_rows(out / "report.html")
    assert len(rows) == 2
    assert "run_a" in rows[0] and "0.200 → 0.500" in rows[0]
    assert "run_b" in rows[1] and "0.400 → 0.600" in rows[1]
    assert all(b.startswith(PNG) for b in payloads(out / "report.html"))


def test_a_killed_run_with_a_cut_last_line_is_reported_as_incomplete(tmp_path, caplog):
    run = write_run(tmp_path / "killed", steps=25, finished=False, truncated=True)
    with caplog.at_level("INFO", logger="tba"):
        page = report([run], tmp_path / "out")
    logged = [r.getMessage() for r in caplog.records]
    assert len(payloads(page)) == len(FIGURES)
    (row,) = table_rows(page)
    assert "running/killed: last step 25" in row and "1 unparseable line skipped" in row
    assert "last eval 0.450 at step 20" in row and "<td>tb</td>" in row  # objective from config.yaml
    assert any("unparseable" in m for m in logged) and any("no summary.json" in m for m in logged)


def test_a_dir_without_metrics_is_refused_with_its_name(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    good = write_run(tmp_path / "good")
    assert main(["report", str(good), str(tmp_path / "empty"), "--out", str(tmp_path / "o")]) == 1
    err = capsys.readouterr().err
    assert str(tmp_path / "empty") in err and "metrics.jsonl" in err
    assert not (tmp_path / "o").exists()


@pytest.fixture
def drawn(monkeypatch):
    """What each saved figure holds, read back from the figure as it is saved:
    {file name: (suptitle, {panel title: {line label: (xs, ys)}})}; unlabelled (faint raw) lines are left out."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    figures, save = {}, Figure.savefig

    def record(fig, path, *args, **kwargs):
        panels = {ax.get_title(): {line.get_label(): (list(line.get_xdata()), list(line.get_ydata()))
                                   for line in ax.lines if not line.get_label().startswith("_")} for ax in fig.axes}
        figures[Path(path).name] = (fig.get_suptitle(), panels)
        return save(fig, path, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", record)
    return figures


def test_the_wall_clock_score_starts_at_the_start_evaluation(tmp_path, drawn):
    # summary.json's evals start with (0, 0.25, 0.0): the evaluation before the first update, which has no
    # metrics line; the logged ones are at steps 10/20/30 = 15/20/25 s
    report([write_run(tmp_path / "r")], tmp_path / "out")
    _, panels = drawn["score.png"]
    (wall,) = [lines["score"] for title, lines in panels.items() if "wall clock" in title]
    (step,) = [lines["score"] for title, lines in panels.items() if "update" in title]
    assert wall == ([0.0, 15.0, 20.0, 25.0], [0.25, 0.35, 0.45, 0.55])
    assert step == ([0.0, 10.0, 20.0, 30.0], [0.25, 0.35, 0.45, 0.55])


def test_the_buffer_panel_says_held_for_the_buffer_age_and_drawn_for_the_staleness(tmp_path, drawn):
    report([write_run(tmp_path / "r")], tmp_path / "out")  # age_mean = step/2, staleness 1.5
    _, panels = drawn["buffer.png"]
    age_panels = [(title, lines) for title, lines in panels.items() if "age" in title]
    assert len(age_panels) == 1
    title, lines = age_panels[0]
    assert "held" in title and "drawn" in title
    assert lines["held (buffer/age_mean)"][1] == [s / 2 for s in range(1, 31)]
    assert lines["drawn (staleness/mean)"][1] == [1.5] * 30
    for title, lines in panels.items():  # no panel calls the buffer's age the drawn samples' age
        assert "drawn" not in title or "drawn (staleness/mean)" in lines


def test_each_figure_title_is_printed_once_as_the_page_heading(tmp_path, drawn):
    page = report([write_run(tmp_path / "r")], tmp_path / "out")
    text = page.read_text()
    for fname, title, _ in FIGURES:
        assert drawn[fname][0] == ""  # no figure title of its own
        assert text.count(f"<h2>{html.escape(title)}</h2>") == 1
