"""The bert model family (BERT-style sentence encoders: bge, all-MiniLM): the ctypes face of
native/bert.{c,h}'s ds4n_bert_new, an encoder (ds4d.engine.encoder) with learned positions,
biases everywhere and a GELU FFN."""

from __future__ import annotations

import ctypes

from ds4d.engine import native
from ds4d.engine.decoder import ShapeC
from ds4d.engine.encoder import EncoderModel
from ds4d.engine.gguf_file import GGUFFile

FAMILY = "bert"


class HParamsC(ctypes.Structure):
    """struct ds4n_bert_hparams."""

    _fields_ = [("shape", ShapeC), ("n_pos", ctypes.c_int32), ("n_token_types", ctypes.c_int32)]


class BertModel(EncoderModel):
    family = FAMILY
    prefix = "bert"
    hparams = HParamsC
    # Slot order of native/bert.h (after decoder.SHARED_GLOBAL_SLOTS).
    global_slots = ("token_types.weight", "position_embd.weight", "token_embd_norm.weight",
                    "token_embd_norm.bias")  # fmt: skip
    layer_slots = (
        "attn_q.weight", "attn_q.bias", "attn_k.weight", "attn_k.bias", "attn_v.weight",
        "attn_v.bias", "attn_output.weight", "attn_output.bias", "attn_output_norm.weight",
        "attn_output_norm.bias", "ffn_up.weight", "ffn_up.bias", "ffn_down.weight",
        "ffn_down.bias", "layer_output_norm.weight", "layer_output_norm.bias",
    )  # fmt: skip
    optional = frozenset({"output_norm.weight", "output.weight"})  # an encoder has neither


def load(gf: GGUFFile, pool: native.Pool) -> BertModel:
    return BertModel(gf, pool)
