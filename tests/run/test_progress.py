"""Progress without a terminal is a plain, complete line (a log file or CI never sees a truncated bar)."""

from tba.run.progress import RunProgress

BAR_CHARACTERS = set("━─╸╺█▏▎▍▌▋▊▉\r\x1b")


def test_without_a_terminal_progress_is_plain_lines(capsys):
    with RunProgress(3, plain_every_s=0.0) as progress:
        for step in (1, 2, 3):
            progress.update(step, reward=0.5, score=0.25, beta=0.05, tokens_per_s=1234.0, staleness=1.5, replay=3.24,
                            search_tokens_per_s=567.4, mfu=0.0123)
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 3 and not BAR_CHARACTERS & set(err), repr(err)
    assert lines[-1].startswith("step 3/3 · 0:00:00 elapsed, eta 0:00:00 · reward 0.500 · eval 0.250 · β 0.05")
    assert "staleness 1.5 · replay 3.2× · train 1,234 tok/s · search 567 tok/s · MFU 1.2%" in lines[-1]


def test_throughput_shows_only_what_is_known():
    from tba.run.progress import throughput

    assert throughput(1234.0) == "train 1,234 tok/s"
    assert throughput(10.0, float("nan"), 0.00042) == "train 10 tok/s · MFU 0.042%"


def test_plain_lines_are_rate_limited_but_the_last_step_is_always_shown(capsys):
    with RunProgress(50, plain_every_s=3600.0, start=10) as progress:
        for step in range(11, 51):
            progress.update(step, reward=0.5, score=0.25, beta=0.05, tokens_per_s=1.0)
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("step 50/50")


def test_disabled_progress_prints_nothing(capsys):
    with RunProgress(2, enabled=False, plain_every_s=0.0) as progress:
        progress.update(2, reward=0.5, score=0.25, beta=0.05, tokens_per_s=1.0)
    assert capsys.readouterr().err == ""


def test_log_lines_reach_the_console_once_warnings_marked(capsys):
    import logging

    from tba.run.progress import ConsoleHandler, log_to_console

    tba = logging.getLogger("tba")
    before = list(tba.handlers)
    try:
        log_to_console()
        log_to_console()  # once: a second call adds no second handler
        assert sum(isinstance(h, ConsoleHandler) for h in tba.handlers) == 1
        logging.getLogger("tba.algorithm.loop").info("buffer prefilled")
        logging.getLogger("tba.run.build").warning("tb.beta_final is too large")
        err = capsys.readouterr().err
        assert "buffer prefilled\n" in err and "warning: tb.beta_final is too large\n" in err
    finally:
        tba.handlers[:] = before
