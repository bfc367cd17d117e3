"""The nomic-bert model family (nomic-embed-text v1 / v1.5): GGUF validation and the ctypes
face of ds4n_nomic_bert_new (native/bert.{c,h}). BERT's post-norm encoder with rotary
positions (NEOX, the file's `rope.freq_base`) instead of a position table, a SwiGLU FFN and
no biases; token type 0 when the file carries a token-type table. It only embeds (its GGUF
declares a pooling, mean for the released models), through ds4d.engine.embedding; its
tokenizer is WordPiece (the GGUF's `bert` vocabulary), as bert's.
"""

from __future__ import annotations

import ctypes

from ds4d.engine import native
from ds4d.engine.bert import post_norm_shapes, refuse_causal
from ds4d.engine.decoder import DecoderModel, DenseShape, HParams, ShapeC
from ds4d.engine.errors import ModelLoadError
from ds4d.engine.gguf_file import GGUFFile

FAMILY = "nomic-bert"

# Slot order of native/bert.h's nomic-bert enums (after decoder.SHARED_GLOBAL_SLOTS).
GLOBAL_SLOTS = ("token_types.weight", "token_embd_norm.weight", "token_embd_norm.bias")
LAYER_SLOTS = (
    "attn_qkv.weight", "attn_q.weight", "attn_k.weight", "attn_v.weight",
    "attn_output.weight", "attn_output_norm.weight", "attn_output_norm.bias",
    "ffn_gate.weight", "ffn_up.weight", "ffn_down.weight",
    "layer_output_norm.weight", "layer_output_norm.bias",
)  # fmt: skip
QKV_SPLIT = ("attn_q.weight", "attn_k.weight", "attn_v.weight")
# An encoder has no output norm nor head; the token-type table and one of the two QKV forms
# may be absent (the forms checked per layer below).
OPTIONAL = {"output_norm.weight", "output.weight", "token_types.weight", "attn_qkv.weight",
            *QKV_SPLIT}  # fmt: skip


class HParamsC(ctypes.Structure):
    """struct ds4n_nomic_bert_hparams."""

    _fields_ = [("shape", ShapeC), ("n_token_types", ctypes.c_int32)]


class RotaryEncoderShape(DenseShape):
    """A rotary encoder's hyper-parameters: DenseShape's with a LayerNorm epsilon, every
    head a key/value head, and the token-type table's rows (0: none)."""

    def __init__(self, gf: GGUFFile, family: str) -> None:
        hp = self.hp = HParams(gf)
        self.n_layer = int(hp("block_count"))
        self.n_embd = int(hp("embedding_length"))
        self.n_ff = int(hp("feed_forward_length"))
        self.n_head = int(hp("attention.head_count"))
        self.n_head_kv = int(hp("attention.head_count_kv", self.n_head))
        self.head_dim = self.n_embd // max(self.n_head, 1)
        self.n_rot = int(hp("rope.dimension_count", self.head_dim))
        self.rope_base = float(hp("rope.freq_base", 10000.0))
        self.rms_eps = float(hp("attention.layer_norm_epsilon"))
        self.n_ctx_train = int(hp("context_length"))
        embd = gf.tensor("token_embd.weight")
        self.n_vocab = int(hp("vocab_size", embd.shape[1] if len(embd.shape) == 2 else 0))
        self.n_token_types = 0
        if gf.has_tensor("token_types.weight"):
            types = gf.tensor("token_types.weight")
            self.n_token_types = int(types.shape[1]) if len(types.shape) == 2 else 0
            if self.n_token_types <= 0:
                raise ModelLoadError(f"{family}: token_types.weight of shape {types.shape}")
        if (
            min(self.n_layer, self.n_embd, self.n_head, self.n_ff, self.n_vocab,
                self.n_ctx_train) <= 0
            or self.n_head_kv != self.n_head
            or self.n_embd % self.n_head
            or self.head_dim % 2
            or not 0 < self.n_rot <= self.head_dim
            or self.n_rot % 2
            or not self.rope_base > 0
            or not self.rms_eps >= 0
        ):  # fmt: skip
            raise ModelLoadError(
                f"unsupported {family} shape: {self.n_embd} wide, {self.n_head} heads"
                f" ({self.n_head_kv} kv), rope dims {self.n_rot}, base {self.rope_base}"
            )

    def tensor_shapes(self) -> dict[str, tuple[int, ...]]:
        shapes = super().tensor_shapes()
        shapes.update(post_norm_shapes(self.n_embd, self.n_token_types))
        return shapes


class NomicBertModel(DecoderModel):
    family = FAMILY
    prefix = "nomic_bert"

    def __init__(self, gf: GGUFFile, pool: native.Pool) -> None:
        refuse_causal(gf, self.family)
        sh = RotaryEncoderShape(gf, self.family)
        super().__init__(gf, pool, sh)
        for il in range(sh.n_layer):
            fused = gf.has_tensor(f"blk.{il}.attn_qkv.weight")
            split = [gf.has_tensor(f"blk.{il}.{name}") for name in QKV_SPLIT]
            if any(split) if fused else not all(split):
                raise ModelLoadError(f"{FAMILY}: layer {il} needs attn_qkv or attn_q/k/v")
        params = HParamsC(sh.c_shape(), sh.n_token_types)
        self.open_native(LAYER_SLOTS, sh.tensor_shapes(), OPTIONAL, params, GLOBAL_SLOTS)


def load(gf: GGUFFile, pool: native.Pool) -> NomicBertModel:
    return NomicBertModel(gf, pool)
