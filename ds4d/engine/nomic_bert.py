"""The nomic-bert model family (nomic-embed-text v1 / v1.5): the ctypes face of
native/bert.{c,h}'s ds4n_nomic_bert_new, BERT's encoder (ds4d.engine.encoder) with rotary
positions (NEOX, the file's `rope.freq_base`) instead of a position table, a fused or split
QKV, a SwiGLU FFN and no biases; token type 0 when the file carries a token-type table.
The released models pool by the mean."""

from __future__ import annotations

import ctypes

from ds4d.engine import native
from ds4d.engine.decoder import ShapeC
from ds4d.engine.encoder import EncoderModel
from ds4d.engine.gguf_file import GGUFFile

FAMILY = "nomic-bert"


class HParamsC(ctypes.Structure):
    """struct ds4n_nomic_bert_hparams."""

    _fields_ = [("shape", ShapeC), ("n_token_types", ctypes.c_int32)]


class NomicBertModel(EncoderModel):
    family = FAMILY
    prefix = "nomic_bert"
    hparams = HParamsC
    # Slot order of native/bert.h's nomic-bert enums (after decoder.SHARED_GLOBAL_SLOTS).
    global_slots = ("token_types.weight", "token_embd_norm.weight", "token_embd_norm.bias")
    layer_slots = (
        "attn_qkv.weight", "attn_q.weight", "attn_k.weight", "attn_v.weight",
        "attn_output.weight", "attn_output_norm.weight", "attn_output_norm.bias",
        "ffn_gate.weight", "ffn_up.weight", "ffn_down.weight",
        "layer_output_norm.weight", "layer_output_norm.bias",
    )  # fmt: skip
    # No output norm nor head; the token-type table and one of the two QKV forms may be
    # absent (the forms are checked per layer).
    optional = frozenset({"output_norm.weight", "output.weight", "token_types.weight",
                          "attn_qkv.weight", "attn_q.weight", "attn_k.weight",
                          "attn_v.weight"})  # fmt: skip


def load(gf: GGUFFile, pool: native.Pool) -> NomicBertModel:
    return NomicBertModel(gf, pool)
