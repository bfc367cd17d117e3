"""The model card's capabilities (/api/show): `embedding` exactly for the files that
declare a pooling (the kit's embedding fixtures), `completion` for the others."""

from __future__ import annotations

from pathlib import Path

import pytest

from ds4d.daemon.model_card import read_card
from tests.helpers.kit import embed_kit_families, kit_families, kit_model


@pytest.mark.parametrize("family", embed_kit_families())
def test_an_embedding_model_has_the_embedding_capability_alone(family: str) -> None:
    card = read_card(Path(kit_model(family)))
    assert card.embedding
    assert card.capabilities == ["embedding"]


@pytest.mark.parametrize("family", ["qwen3", "gemma3", "llama"])
def test_a_generation_model_completes_and_does_not_embed(family: str) -> None:
    assert family in kit_families()
    card = read_card(Path(kit_model(family)))
    assert not card.embedding
    assert card.capabilities[0] == "completion"
    assert "embedding" not in card.capabilities
