"""The bert model family (BERT-style sentence encoders: bge, all-MiniLM): GGUF validation
and the ctypes face of native/bert.{c,h}. An encoder: bidirectional attention, learned
positions, post-norm LayerNorm, a GELU FFN; it only embeds (its GGUF declares a pooling),
through ds4d.engine.embedding. Its tokenizer is WordPiece (ds4d.engine.tokenizer, the GGUF's
`bert` vocabulary)."""

from __future__ import annotations

import ctypes

from ds4d.engine import native
from ds4d.engine.decoder import DecoderModel, DenseShape, HParams, ShapeC
from ds4d.engine.errors import ModelLoadError
from ds4d.engine.gguf_file import GGUFFile

FAMILY = "bert"

# Slot order of native/bert.h (after decoder.SHARED_GLOBAL_SLOTS).
GLOBAL_SLOTS = ("token_types.weight", "position_embd.weight", "token_embd_norm.weight",
                "token_embd_norm.bias")  # fmt: skip
LAYER_SLOTS = (
    "attn_q.weight", "attn_q.bias", "attn_k.weight", "attn_k.bias", "attn_v.weight",
    "attn_v.bias", "attn_output.weight", "attn_output.bias", "attn_output_norm.weight",
    "attn_output_norm.bias", "ffn_up.weight", "ffn_up.bias", "ffn_down.weight",
    "ffn_down.bias", "layer_output_norm.weight", "layer_output_norm.bias",
)  # fmt: skip
OPTIONAL = {"output_norm.weight", "output.weight"}  # an encoder has neither


def post_norm_shapes(n_embd: int, n_token_types: int) -> dict[str, tuple[int, ...]]:
    """The tensors every post-norm encoder (bert, nomic-bert) adds to a decoder's: the
    token-type table and the three LayerNorms (embeddings, after attention, after FFN)."""
    E = n_embd
    return {
        "token_types.weight": (E, n_token_types),
        "token_embd_norm.weight": (E,), "token_embd_norm.bias": (E,),
        "attn_output_norm.weight": (E,), "attn_output_norm.bias": (E,),
        "layer_output_norm.weight": (E,), "layer_output_norm.bias": (E,),
    }  # fmt: skip


def refuse_causal(gf: GGUFFile, family: str) -> None:
    """The encoder families run bidirectional attention only."""
    if gf.get(f"{gf.architecture}.attention.causal", False) is True:
        raise ModelLoadError(f"a causal {family} model is not supported (encoders only)")


class HParamsC(ctypes.Structure):
    """struct ds4n_bert_hparams."""

    _fields_ = [("shape", ShapeC), ("n_pos", ctypes.c_int32), ("n_token_types", ctypes.c_int32)]


class EncoderShape(DenseShape):
    """An encoder's hyper-parameters: DenseShape's, with a LayerNorm epsilon and the
    learned position table's length as its context."""

    def __init__(self, gf: GGUFFile, family: str) -> None:
        hp = self.hp = HParams(gf)
        self.n_layer = int(hp("block_count"))
        self.n_embd = int(hp("embedding_length"))
        self.n_ff = int(hp("feed_forward_length"))
        self.n_head = int(hp("attention.head_count"))
        self.n_head_kv = int(hp("attention.head_count_kv", self.n_head))
        self.head_dim = self.n_embd // max(self.n_head, 1)
        self.n_rot = self.head_dim
        self.rope_base = 10000.0  # unused: no rotation
        self.rms_eps = float(hp("attention.layer_norm_epsilon"))
        embd = gf.tensor("token_embd.weight")
        self.n_vocab = int(hp("vocab_size", embd.shape[1] if len(embd.shape) == 2 else 0))
        pos = gf.tensor("position_embd.weight")
        types = gf.tensor("token_types.weight")
        self.n_pos = int(pos.shape[1]) if len(pos.shape) == 2 else 0
        self.n_token_types = int(types.shape[1]) if len(types.shape) == 2 else 0
        self.n_ctx_train = min(int(hp("context_length")), self.n_pos)
        if (
            min(self.n_layer, self.n_embd, self.n_head, self.n_ff, self.n_vocab) <= 0
            or self.n_head_kv != self.n_head
            or self.n_embd % self.n_head
            or self.head_dim % 2
            or self.n_pos <= 0
            or self.n_token_types <= 0
            or not self.rms_eps >= 0
        ):  # fmt: skip
            raise ModelLoadError(
                f"unsupported {family} shape: {self.n_embd} wide, {self.n_head} heads,"
                f" {self.n_pos} positions, {self.n_token_types} token types"
            )

    def tensor_shapes(self) -> dict[str, tuple[int, ...]]:
        E, F = self.n_embd, self.n_ff
        shapes = super().tensor_shapes()
        shapes.update(post_norm_shapes(E, self.n_token_types))
        shapes.update({"position_embd.weight": (E, self.n_pos), "ffn_up.bias": (F,),
                       "ffn_down.bias": (E,)})  # fmt: skip
        return shapes


class BertModel(DecoderModel):
    family = FAMILY
    prefix = "bert"

    def __init__(self, gf: GGUFFile, pool: native.Pool) -> None:
        refuse_causal(gf, self.family)
        sh = EncoderShape(gf, self.family)
        super().__init__(gf, pool, sh)
        params = HParamsC(sh.c_shape(), sh.n_pos, sh.n_token_types)
        self.open_native(LAYER_SLOTS, sh.tensor_shapes(), OPTIONAL, params, GLOBAL_SLOTS)


def load(gf: GGUFFile, pool: native.Pool) -> BertModel:
    return BertModel(gf, pool)
