"""docs/configuration.md's key table is the broker's own config description, regenerated."""
from scripts.gen_config_docs import PAGE, render


def test_configuration_page_is_current():
    page = PAGE.read_text(encoding="utf-8")
    assert render(page) == page, "docs/configuration.md is stale: run python scripts/gen_config_docs.py"


def test_every_broker_key_is_on_the_page():
    from tidemq.node.config import describe
    keys = [row.split("`")[1] for row in describe().splitlines()[2:]]
    page = PAGE.read_text(encoding="utf-8")
    assert keys and all(f"`{k}`" in page for k in keys)
