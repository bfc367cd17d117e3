"""Claude Code's billing-header line is dropped from system text before rendering."""

from __future__ import annotations

import json

from ds4d.state.normalize import normalize_system_blocks, strip_billing_header


def test_lines_differing_only_in_cch_normalise_to_the_same_text():
    a = "x-anthropic-billing-header: cc_version=2.1.37.abc; cc_entrypoint=cli; cch=0a1b2;\nYou are Claude Code."
    b = "x-anthropic-billing-header: cc_version=2.1.37.f00; cc_entrypoint=cli; cch=99fe1;\nYou are Claude Code."
    assert strip_billing_header(a) == strip_billing_header(b) == "You are Claude Code."


def test_other_text_untouched():
    text = "Mention x-anthropic-billing-header: only at line start counts.\nkeep me"
    assert strip_billing_header(text) == text
    assert strip_billing_header("plain") == "plain"


def test_real_claude_code_system_blocks(data_dir):
    body = json.loads(
        (data_dir / "fixtures/clients/claude-code-2.1.197-first-request.json").read_text()
    )["body"]
    blocks = [b["text"] for b in body["system"]]
    out = normalize_system_blocks(blocks)
    assert len(out) == len(blocks) - 1  # the billing block disappears entirely
    assert out == blocks[1:]
    assert not any("billing-header" in b for b in out)
