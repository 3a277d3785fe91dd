
import pytest
from paths import RECIPES as RECIPES_FOLDER

from tba.config import load_config

RECIPES_DIR = RECIPES_FOLDER
RECIPES = sorted(RECIPES_DIR.glob("*.yaml"))


@pytest.mark.parametrize("recipe", RECIPES, ids=[r.stem for r in RECIPES])
def test_every_shipped_recipe_loads_and_validates(recipe):
    """Every rule of the config; not whether this machine has the optional libraries a GPU recipe names (vLLM): a
    recipe is valid before it is installed (tba.config.validate's check_installed)."""
    cfg = load_config(recipe, check_installed=False)
    assert cfg.trainer.steps > 0 and cfg.output_dir


def test_gsm8k_recipe_has_the_papers_beta_schedule():
    """TBA paper Table 2 (GSM8K): β 0.012 → 0.004, linear to step 500, and a hard stop at step 500."""
    tb = load_config(RECIPES_DIR / "gsm8k-rho1b.yaml").tb
    assert (tb.beta_init, tb.beta_final, tb.beta_decay_end_step, tb.beta_hard_stop_step) == (0.012, 0.004, 500, 500)
