"""`tba report RUN_DIR [RUN_DIR ...] [--out DIR]`: one self-contained `report.html` (plus the PNGs) per run or
per comparison of runs.

Why: `metrics.jsonl` is the one record every run writes, finished or not (TensorBoard is optional and needs a
server). The questions asked of an async TB run are always the same — did the held-out score rise per second and
per update, how stale were the trained samples, what did the buffer hold, was the trainer or the searcher idle,
did the loss behave — so the same six figures answer them every time, overlaid when runs are compared. The HTML
inlines every figure as base64, so it opens offline and can be attached to an issue as one file. A run that is
still going or was killed (no `summary.json`, maybe a last line cut mid-write) is reported as such, not refused.
matplotlib (the `bench` extra) is imported only here, with the Agg backend.
"""

from __future__ import annotations

import base64
import dataclasses
import html
import json
import logging
import math
from dataclasses import dataclass
from pathlib import Path

import yaml

from tba.errors import UserError

logger = logging.getLogger(__name__)


class ReportError(UserError, ValueError):
    pass


@dataclass
class Run:
    path: Path
    name: str
    rows: list[dict]
    bad_lines: int
    summary: dict | None
    config: dict
    evals: list[dict] = dataclasses.field(default_factory=list)
    """RUN_DIR/eval/*.json: what `tba eval` measured of this run's policies (tba.run.eval_target)."""

    def get(self, key: str):
        """objective/runtime/mode/seed: from summary.json, else from config.yaml (a killed run has only that)."""
        for src in (self.summary or {}, self.config):
            if src.get(key) is not None:
                return src[key]
        return None


def load_run(path: Path) -> Run:
    path = Path(path)
    metrics = path / "metrics.jsonl"
    if not metrics.is_file():
        raise ReportError(f"{path}: not a run directory (no metrics.jsonl)")
    rows, bad = [], 0
    for line in metrics.read_text(errors="replace").splitlines():
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            bad += 1
            continue
        if isinstance(row, dict) and isinstance(row.get("step"), int | float):
            rows.append(row)
        else:
            bad += 1
    if not rows:
        raise ReportError(f"{path}: metrics.jsonl has no complete lines yet")
    summary = None
    if (path / "summary.json").is_file():
        try:
            summary = json.loads((path / "summary.json").read_text())
        except json.JSONDecodeError:
            summary = None
    config = {}
    if (path / "config.yaml").is_file():
        try:
            config = yaml.safe_load((path / "config.yaml").read_text()) or {}
        except yaml.YAMLError:
            config = {}
    return Run(path, path.resolve().name or str(path), rows, bad, summary, config if isinstance(config, dict) else {},
               eval_results(path))


def eval_results(path: Path) -> list[dict]:
    """The run's `tba eval` results, by name; an unreadable file is skipped with a warning."""
    out = []
    for f in sorted((path / "eval").glob("*.json")):
        try:
            result = json.loads(f.read_text())
        except (OSError, ValueError) as e:
            logger.warning(f"{f}: skipped ({e})")
            continue
        if isinstance(result, dict):
            out.append(result | {"file": f.name})
    return out


def _num(v) -> float | None:
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        return None
    return float(v)


def series(run: Run, key: str, x: str = "step") -> tuple[list[float], list[float]]:
    """(x, y) over the lines where both are numbers; null (no fresh samples that step) and absent are skipped."""
    xs, ys = [], []
    for row in run.rows:
        a, b = _num(row.get(x)), _num(row.get(key))
        if a is not None and b is not None:
            xs.append(a)
            ys.append(b)
    return xs, ys


def rolling(ys: list[float], window: int) -> list[float]:
    out, total = [], 0.0
    for i, y in enumerate(ys):
        total += y - (ys[i - window] if i >= window else 0.0)
        out.append(total / min(i + 1, window))
    return out


# figure file, title, panels; panel = (title, y label, x key, [(metric key, label)], log y)
WALL, STEP = "wall_clock_s", "step"
FIGURES = [
    ("score.png", "Held-out score (eval/score)", [
        ("vs wall clock (start evaluation at 0)", "score", WALL, [("eval/score", "score")], False),
        ("vs update (step 0: the start evaluation)", "score", STEP, [("eval/score", "score")], False)]),
    ("reward.png", "Train reward (searcher/reward_mean, rolling mean; raw faint)", [
        ("vs wall clock", "reward", WALL, [("searcher/reward_mean", "reward")], False),
        ("vs update", "reward", STEP, [("searcher/reward_mean", "reward")], False)]),
    ("staleness.png", "Staleness of trained samples (policy versions behind the trainer)", [
        ("per-update mean", "versions behind", STEP, [("staleness/mean", "mean")], False),
        ("per-update max", "versions behind", STEP, [("staleness/max", "max")], False)]),
    ("buffer.png", "Replay buffer", [
        ("size", "samples", STEP, [("buffer/size", "size")], False),
        ("mean sample age: held vs drawn", "versions behind the trainer", STEP,
         [("buffer/age_mean", "held (buffer/age_mean)"), ("staleness/mean", "drawn (staleness/mean)")], False),
        ("online-draw share", "fraction", STEP, [("buffer/online_fraction", "online share")], False)]),
    ("throughput.png", "Throughput", [
        ("busy fractions", "fraction of time busy", STEP,
         [("trainer/busy_fraction", "trainer"), ("searcher/busy_fraction", "searcher")], False),
        ("tokens/s: trainer (trained) and searchers (generated)", "tokens/s", STEP,
         [("trainer/tokens_per_s", "trainer"), ("searcher/tokens_per_s", "searchers")], False),
        ("model FLOPs utilization (trainer/mfu)", "MFU", STEP, [("trainer/mfu", "MFU")], False)]),
    ("optimization.png", "Optimization (loss: rolling mean; raw faint)", [
        ("loss", "loss", STEP, [("trainer/loss", "loss")], False),
        ("grad norm", "grad norm (log)", STEP, [("trainer/grad_norm", "grad norm")], True),
        ("log Ẑ mean", "log Ẑ", STEP, [("trainer/log_z_mean", "log Ẑ mean")], False),
        ("residual", "residual", STEP,
         [("trainer/residual_std", "std (RMS)"), ("trainer/residual_max", "max abs")], False)]),
]
OPTIONAL_PANELS = {"log Ẑ mean", "residual", "model FLOPs utilization (trainer/mfu)"}  # only when some run logged them
SMOOTHED = {"searcher/reward_mean", "trainer/loss"}  # noisy per step: rolling mean over the raw, drawn faint
STYLES = ["-", "--", ":", "-."]


def source_figure(runs: list[Run]) -> list:
    """A figure of each source's share, reward and age of the drawn samples — for runs with several sources
    (searcher groups, data), which log `source/<name>/…` keys; none otherwise."""
    names = sorted({k.split("/")[1] for r in runs for row in r.rows for k in row
                    if k.startswith("source/") and k.endswith("/draw_share")})
    if not names:
        return []
    return [("sources.png", "Sources of the drawn samples (searcher groups, data)", [
        ("share of the drawn samples", "fraction", STEP, [(f"source/{n}/draw_share", n) for n in names], False),
        ("their mean reward", "reward", STEP, [(f"source/{n}/draw_reward_mean", n) for n in names], False),
        ("their age", "versions behind the trainer", STEP, [(f"source/{n}/age_mean", n) for n in names], False)])]


def _with_summary_evals(run: Run, xs: list[float], ys: list[float], x: str) -> tuple[list[float], list[float]]:
    """summary.json's evals (step, score, training seconds) add the evaluation before the first update, which
    has no metrics line: at step 0 on the update axis, at 0 on the wall-clock axis (it ran before the first
    update; its own wall-clock time is not recorded). A run without summary.json (running or killed) has it
    only in its checkpoint, so there the curves start at the first logged evaluation."""
    points = dict(zip(xs, ys, strict=True))
    for ev in (run.summary or {}).get("evals") or []:
        if isinstance(ev, list | tuple) and len(ev) >= 2 and _num(ev[0]) is not None and _num(ev[1]) is not None:
            if x == STEP or ev[0] == 0:
                points.setdefault(float(ev[0]) if x == STEP else 0.0, float(ev[1]))
    return sorted(points), [points[k] for k in sorted(points)]


def _wall_unit(runs: list[Run]) -> tuple[float, str]:
    top = max((max(series(r, WALL)[1], default=0.0) for r in runs), default=0.0)
    return (3600.0, "h") if top > 3 * 3600 else (60.0, "min") if top > 180 else (1.0, "s")


def plot_figure(plt, runs: list[Run], panels: list, path: Path) -> None:
    present = lambda k: any(k in row for r in runs for row in r.rows)  # noqa: E731
    panels = [p for p in panels if p[0] not in OPTIONAL_PANELS or any(present(k) for k, _ in p[3])]
    scale, unit = _wall_unit(runs)
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 3.9), squeeze=False)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, (ptitle, ylabel, x, keys, logy) in zip(axes[0], panels, strict=True):
        drawn = 0
        for i, run in enumerate(runs):
            color = colors[i % len(colors)]
            for j, (key, label) in enumerate(keys):
                xs, ys = series(run, key, x)
                if key == "eval/score":
                    xs, ys = _with_summary_evals(run, xs, ys, x)
                if not xs:
                    continue
                if x == WALL:
                    xs = [v / scale for v in xs]
                name = (f"{run.name}: {label}" if len(keys) > 1 else run.name) if len(runs) > 1 else label
                if key in SMOOTHED:
                    window = max(1, min(20, len(ys) // 10))
                    ax.plot(xs, ys, color=color, alpha=0.2, linewidth=0.8)
                    ys, name = rolling(ys, window), f"{name} (rolling {window})"
                if logy:  # a log axis cannot show 0 (e.g. a skipped step's grad norm)
                    kept = [(a, b) for a, b in zip(xs, ys, strict=True) if b > 0]
                    xs, ys = [a for a, _ in kept], [b for _, b in kept]
                    if not xs:
                        continue
                marker = "o" if key.startswith("eval/") else None
                ax.plot(xs, ys, color=color, linestyle=STYLES[j % len(STYLES)], marker=marker, markersize=4,
                        label=name)
                drawn += 1
                if key == "eval/score" and x == STEP:
                    drawn += _eval_markers(ax, run, color, len(runs) > 1)
        if drawn and logy:
            ax.set_yscale("log")
        if not drawn:
            ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes, color="gray")
        ax.set_title(ptitle, fontsize=10)
        ax.set_xlabel(f"wall clock since launch ({unit})" if x == WALL else "update (trainer step)")
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
        evals = x == STEP and keys[0][0] == "eval/score" and any(r.evals for r in runs)
        if drawn and (len(runs) > 1 or len(keys) > 1 or evals):
            ax.legend(fontsize=8)
    fig.tight_layout()  # no suptitle: the page's heading above the image names the figure
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _eval_markers(ax, run: Run, color, prefix: bool) -> int:
    """`tba eval`'s greedy score (◆) and sampled pass@k (▲) of each evaluated policy, at its step: beside the curve
    of the same run's own evaluations."""
    drawn = 0
    for r in run.evals:
        step, greedy, sampled = _num(r.get("step")), (r.get("greedy") or {}).get("score"), r.get("sampled") or {}
        if step is None:
            continue
        points = ([("D", "greedy", greedy)] if _num(greedy) is not None else []) + [
            ("^", k, v) for k, v in sampled.items() if k.startswith("pass@") and _num(v) is not None]
        for marker, what, value in points:
            label = f"{run.name}: " * prefix + f"tba eval {r.get('name', r['file'])} {what}"
            ax.plot([step], [value], marker=marker, color=color, markersize=7, linestyle="none", label=label)
            drawn += 1
    return drawn


def eval_table(runs: list[Run]) -> str:
    """One HTML row per `tba eval` result: its policy, dataset size, backend, greedy score and pass@k."""
    rows = [(run, r) for run in runs for r in run.evals]
    if not rows:
        return ""
    e = html.escape
    head = ["run", "file", "step", "problems", "backend", "greedy score", "= run's own", "pass@k (n samples)"]
    out = ["<h2>tba eval</h2><table><tr>" + "".join(f"<th>{h}</th>" for h in head) + "</tr>"]
    for run, r in rows:
        sampled = r.get("sampled") or {}
        passes = ", ".join(f"{k} {_fmt(v)}" for k, v in sampled.items() if k.startswith("pass@"))
        cells = [run.name, r["file"], _fmt_str(r.get("step")), _fmt_str(r.get("problems")), _fmt_str(r.get("backend")),
                 _fmt((r.get("greedy") or {}).get("score")), _fmt_str(r.get("matches_run")),
                 f"{passes} (n={sampled['samples']})" if passes else "–"]
        out.append("<tr>" + "".join(f"<td>{e(c)}</td>" for c in cells) + "</tr>")
    return "".join(out) + "</table>"


def _fmt(v, spec: str = ".3f") -> str:
    return format(v, spec) if _num(v) is not None else "–"


def header_row(run: Run) -> list[str]:
    last = run.rows[-1]
    steps = int(last["step"])
    s = run.summary
    if s is not None:
        status = "finished"
        score = f"{_fmt(s.get('score_start'))} → {_fmt(s.get('score_end'))}"
        wall = s.get("wall_clock_s", last.get("wall_clock_s"))
        steps = s.get("trainer_steps", steps)
    else:
        status = f"running/killed: last step {steps}"
        evals = series(run, "eval/score")
        score = f"last eval {_fmt(evals[1][-1])} at step {int(evals[0][-1])}" if evals[0] else "no eval logged"
        wall = last.get("wall_clock_s")
    if run.bad_lines:
        status += f" ({run.bad_lines} unparseable line{'s' * (run.bad_lines > 1)} skipped)"
    return [run.name, str(run.path), *(_fmt_str(run.get(k)) for k in ("objective", "runtime", "mode", "seed")),
            str(steps), score,
            f"{_fmt(wall, '.0f')} s", throughput(run), status]


def _median(ys: list[float]) -> float | None:
    return sorted(ys)[len(ys) // 2] if ys else None


def throughput(run: Run) -> str:
    """The medians over the updates of trainer/tokens_per_s, searcher/tokens_per_s and trainer/mfu, those logged."""
    trainer, searchers, mfu = (_median(series(run, k)[1]) for k in
                               ("trainer/tokens_per_s", "searcher/tokens_per_s", "trainer/mfu"))
    parts = [f"train {trainer:,.0f} tok/s" if trainer is not None else None,
             f"search {searchers:,.0f} tok/s" if searchers is not None else None,
             f"MFU {100 * mfu:.2g}%" if mfu is not None else None]
    return " · ".join(p for p in parts if p) or "–"


HEAD = ["run", "path", "objective", "runtime", "mode", "seed", "steps", "score start → end", "wall clock",
        "throughput (median)", "status"]
CSS = """body{font-family:sans-serif;margin:2em;max-width:1400px}table{border-collapse:collapse;margin-bottom:1.5em}
td,th{border:1px solid #ccc;padding:4px 8px;text-align:left;font-size:14px}th{background:#f0f0f0}
img{max-width:100%;display:block;margin:0.5em 0 2em 0}pre{background:#f7f7f7;padding:8px;font-size:12px}"""


def _fmt_str(v) -> str:
    return "–" if v is None else str(v)


def render_html(runs: list[Run], figures: list[tuple[str, Path]]) -> str:
    e = html.escape
    parts = ["<!DOCTYPE html><html><head><meta charset='utf-8'><title>tba report: "
             + e(", ".join(r.name for r in runs)) + f"</title><style>{CSS}</style></head><body>",
             "<h1>tba report</h1><table><tr>" + "".join(f"<th>{e(h)}</th>" for h in HEAD) + "</tr>"]
    for run in runs:
        parts.append("<tr>" + "".join(f"<td>{e(c)}</td>" for c in header_row(run)) + "</tr>")
    parts.append("</table>")
    parts.append(eval_table(runs))
    for title, png in figures:
        data = base64.b64encode(png.read_bytes()).decode("ascii")
        parts.append(f"<h2>{e(title)}</h2><img alt='{e(png.name)}' src='data:image/png;base64,{data}'>")
    for run in runs:
        if run.config:
            parts.append(f"<details><summary>config.yaml of {e(run.name)}</summary><pre>"
                         + e(yaml.safe_dump(run.config, sort_keys=False)) + "</pre></details>")
    parts.append("</body></html>")
    return "\n".join(parts)


def report(run_dirs: list[Path], out: Path) -> Path:
    """Read each run dir, write the PNGs and report.html into `out`, return report.html's path."""
    runs = [load_run(Path(p)) for p in run_dirs]
    if not runs:
        raise ReportError("no run directory given")
    names = [r.name for r in runs]
    if len(set(names)) < len(names):  # same leaf name in different places: label by the path given
        for r in runs:
            r.name = str(r.path)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as err:
        raise ReportError("tba report needs matplotlib (pip install 'tba[bench]')") from err
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    for r in runs:
        if r.bad_lines:
            logger.warning(f"{r.path}: skipped {r.bad_lines} unparseable line(s) in metrics.jsonl (cut mid-write?)")
        if r.summary is None:
            logger.warning(f"{r.path}: no summary.json — running or killed, last step {int(r.rows[-1]['step'])}")
    figures = []
    for fname, title, panels in [*FIGURES, *source_figure(runs)]:
        plot_figure(plt, runs, panels, out / fname)
        figures.append((title, out / fname))
    page = out / "report.html"
    page.write_text(render_html(runs, figures), encoding="utf-8")
    return page
