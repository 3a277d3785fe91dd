from pathlib import Path

import pytest

from tba.config import load_config

RECIPES = sorted((Path(__file__).parents[1] / "src" / "tba" / "recipes").glob("*.yaml"))


@pytest.mark.parametrize("recipe", RECIPES, ids=[r.stem for r in RECIPES])
def test_every_shipped_recipe_loads_and_validates(recipe):
    cfg = load_config(recipe)
    assert cfg.trainer.steps > 0 and cfg.output_dir
