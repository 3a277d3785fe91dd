"""tba.run.sft: the warm start refuses a multi-turn task; plateau_warning, the check that flags a warm start still
mid-curve (RL from one can barely move), on held-out accuracy histories of the shape real warm starts log."""

import pytest

from tba.run.sft import plateau_warning


def history(accs: list[float], every: int = 100) -> list[dict]:
    return [{"step": every * (i + 1), "loss": 0.1, "test_accuracy": a} for i, a in enumerate(accs)]


def test_a_warm_start_still_rising_is_flagged_with_its_numbers():
    # still rising over its last four evaluations: 15, 17, 20, 19 %
    msg = plateau_warning(history([0.05, 0.10, 0.15, 0.17, 0.20, 0.194]))
    assert msg and "15.0% → 19.4%" in msg and "steps 300–600" in msg and "sft.steps" in msg


def test_a_plateaued_warm_start_is_not_flagged():
    # plateaued: 34, 34, 33.8, 33.8 %
    assert plateau_warning(history([0.2, 0.3, 0.34, 0.34, 0.338, 0.338])) is None
    assert plateau_warning(history([0.30, 0.31, 0.30, 0.306])) is None  # noise within 2 points
    assert plateau_warning(history([0.36, 0.34, 0.33, 0.31])) is None  # falling is not "still learning"


def test_too_short_a_history_says_nothing():
    assert plateau_warning(history([0.0, 0.5])) is None and plateau_warning([]) is None


def test_a_multi_turn_task_is_refused_pointing_to_data_instead():
    from tba.config.schema import EvalConfig, SFTConfig
    from tba.errors import ConfigError
    from tba.run.sft import train_sft

    class Turns:
        name = "turns"

        def environment(self, prompt):
            raise AssertionError("not reached")

    with pytest.raises(ConfigError, match="task turns is multi-turn; give its demonstrations to TB instead"):
        train_sft(None, None, Turns(), SFTConfig(), seed=0, evaluation=EvalConfig())


def test_the_embedded_default_finds_its_shipped_warm_start_without_training(tmp_path, monkeypatch):
    """The default recipe's warm start ships with the package under the cache's own key: a first run starts RL at
    once. A change to anything the key covers (the recipe's task, model or SFT settings) makes this fail: regenerate
    it (`TBA_CACHE=DIR tba sft`, then copy DIR/sft-arith-KEY to src/tba/recipes/warm_starts/)."""
    from tba.config import load_config
    from tba.run import sft
    from tba.run.build import build_task, warm_start

    monkeypatch.setattr(sft, "train_sft", lambda *a, **k: pytest.fail("trained instead of using the shipped one"))
    cfg = load_config(None, [f"sft.cache_dir={tmp_path}"])
    path = warm_start(cfg, build_task(cfg))
    assert path.parent == sft.SHIPPED and not any(tmp_path.iterdir())
    assert (path / "model.safetensors").stat().st_size < 8 * 2**20  # a few MB in the package
    other = load_config(None, [f"sft.cache_dir={tmp_path}", "seed=1"])
    assert sft.cache_key(other.task, other.model.tiny, other.sft, other.seed) not in path.name  # another seed trains
    fixed = load_config(None, [f"sft.cache_dir={tmp_path}", "seed=1", "sft.seed=0"])
    assert warm_start(fixed, build_task(fixed)) == path  # sft.seed: RL seed 1 over seed 0's start, not trained again
