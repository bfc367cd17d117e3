"""The BERT-style encoder families (bert.py, nomic_bert.py; native/bert.{c,h}): GGUF
validation shared by both, each family's differences as its model's class attributes.
An encoder runs bidirectional attention and post-norm LayerNorms (embeddings, after
attention, after the FFN) with every head a key/value head, and only embeds (its GGUF
declares a pooling), through ds4d.engine.embedding; its tokenizer is WordPiece (the GGUF's
`bert` vocabulary). Its positions are a learned table (bert), or rotary (nomic-bert: NEOX at
the file's `rope.freq_base`) when the family's slots have no `position_embd.weight`.
"""

from __future__ import annotations

import ctypes

from ds4d.engine import native
from ds4d.engine.decoder import DecoderModel, DenseShape, HParams
from ds4d.engine.errors import ModelLoadError
from ds4d.engine.gguf_file import GGUFFile

POSITIONS = "position_embd.weight"
TOKEN_TYPES = "token_types.weight"
QKV_FUSED = "attn_qkv.weight"
QKV_SPLIT = ("attn_q.weight", "attn_k.weight", "attn_v.weight")


def refuse_causal(gf: GGUFFile, family: str) -> None:
    """The encoder families run bidirectional attention only."""
    if gf.get(f"{gf.architecture}.attention.causal", False) is True:
        raise ModelLoadError(f"a causal {family} model is not supported (encoders only)")


def _rows(gf: GGUFFile, name: str) -> int:
    """The rows of a 2-D embedding table (0 for any other shape)."""
    t = gf.tensor(name)
    return int(t.shape[1]) if len(t.shape) == 2 else 0


class EncoderShape(DenseShape):
    """An encoder's hyper-parameters: DenseShape's, with a LayerNorm epsilon, every head a
    key/value head, the token-type table's rows (0: the file has none, where it may) and
    its positions: a learned table's rows (`n_pos`, which bound its context) or rotary
    dimensions and base."""

    def __init__(self, gf: GGUFFile, family: str, *, learned_positions: bool,
                 token_types_required: bool) -> None:  # fmt: skip
        hp = self.hp = HParams(gf)
        self.n_layer = int(hp("block_count"))
        self.n_embd = int(hp("embedding_length"))
        self.n_ff = int(hp("feed_forward_length"))
        self.n_head = int(hp("attention.head_count"))
        self.n_head_kv = int(hp("attention.head_count_kv", self.n_head))
        self.head_dim = self.n_embd // max(self.n_head, 1)
        self.rms_eps = float(hp("attention.layer_norm_epsilon"))
        embd = gf.tensor("token_embd.weight")
        self.n_vocab = int(hp("vocab_size", embd.shape[1] if len(embd.shape) == 2 else 0))
        self.n_token_types = 0
        if token_types_required or gf.has_tensor(TOKEN_TYPES):
            self.n_token_types = _rows(gf, TOKEN_TYPES)
            if self.n_token_types <= 0:
                shape = gf.tensor(TOKEN_TYPES).shape
                raise ModelLoadError(f"{family}: {TOKEN_TYPES} of shape {shape}")
        if learned_positions:
            self.n_pos = _rows(gf, POSITIONS)
            self.n_rot, self.rope_base = self.head_dim, 10000.0  # unused: no rotation
            self.n_ctx_train = min(int(hp("context_length")), self.n_pos)
            positions_bad = self.n_pos <= 0
            positions = f"{self.n_pos} positions"
        else:
            self.n_pos = 0
            self.n_rot = int(hp("rope.dimension_count", self.head_dim))
            self.rope_base = float(hp("rope.freq_base", 10000.0))
            self.n_ctx_train = int(hp("context_length"))
            positions_bad = (self.n_ctx_train <= 0 or not 0 < self.n_rot <= self.head_dim
                             or self.n_rot % 2 != 0 or not self.rope_base > 0)  # fmt: skip
            positions = f"rope dims {self.n_rot}, base {self.rope_base}"
        if (
            min(self.n_layer, self.n_embd, self.n_head, self.n_ff, self.n_vocab) <= 0
            or self.n_head_kv != self.n_head
            or self.n_embd % self.n_head
            or self.head_dim % 2
            or positions_bad
            or not self.rms_eps >= 0
        ):  # fmt: skip
            raise ModelLoadError(
                f"unsupported {family} shape: {self.n_embd} wide, {self.n_head} heads"
                f" ({self.n_head_kv} kv), {positions}"
            )

    def tensor_shapes(self) -> dict[str, tuple[int, ...]]:
        """DenseShape's, and the encoders' own: the token-type and position tables, the
        three LayerNorms and the FFN's biases (each family binds those of its slots)."""
        E, F = self.n_embd, self.n_ff
        shapes = super().tensor_shapes()
        shapes.update({
            TOKEN_TYPES: (E, self.n_token_types), POSITIONS: (E, self.n_pos),
            "token_embd_norm.weight": (E,), "token_embd_norm.bias": (E,),
            "attn_output_norm.weight": (E,), "attn_output_norm.bias": (E,),
            "layer_output_norm.weight": (E,), "layer_output_norm.bias": (E,),
            "ffn_up.bias": (F,), "ffn_down.bias": (E,),
        })  # fmt: skip
        return shapes


class EncoderModel(DecoderModel):
    """An encoder family's model: its native constructor's weight slots (the order of its C
    header, after decoder.SHARED_GLOBAL_SLOTS) and the ones a file may lack, its
    hyper-parameters' struct, whose members after the shape are EncoderShape's attributes
    of those names. Slots with `attn_qkv.weight` take a fused or a split QKV per layer."""

    global_slots: tuple[str, ...] = ()
    layer_slots: tuple[str, ...] = ()
    optional: frozenset[str] = frozenset()
    hparams: type[ctypes.Structure]

    def __init__(self, gf: GGUFFile, pool: native.Pool) -> None:
        refuse_causal(gf, self.family)
        sh = EncoderShape(gf, self.family, learned_positions=POSITIONS in self.global_slots,
                          token_types_required=TOKEN_TYPES not in self.optional)  # fmt: skip
        super().__init__(gf, pool, sh)
        if QKV_FUSED in self.layer_slots:
            for il in range(sh.n_layer):
                fused = gf.has_tensor(f"blk.{il}.{QKV_FUSED}")
                split = [gf.has_tensor(f"blk.{il}.{name}") for name in QKV_SPLIT]
                if any(split) if fused else not all(split):
                    raise ModelLoadError(f"{self.family}: layer {il} needs attn_qkv or attn_q/k/v")
        members = [getattr(sh, field[0]) for field in self.hparams._fields_[1:]]
        params = self.hparams(sh.c_shape(), *members)
        self.open_native(self.layer_slots, sh.tensor_shapes(), self.optional, params,
                         self.global_slots)  # fmt: skip
