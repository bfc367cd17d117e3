"""What the MoE decoder families (qwen3moe.py, gptoss.py) share on the Python side, beside
decoder.py's binding and session state: the attention and expert hyper-parameters every
such file carries, the shapes of the router and expert tensors, and the model's count of
expert bytes read (native/moe.h's counter)."""

from __future__ import annotations

import ctypes

from ds4d.engine import native
from ds4d.engine.decoder import DecoderModel, HParams
from ds4d.engine.errors import ModelLoadError
from ds4d.engine.gguf_file import GGUFFile
from ds4d.engine.native import lib


def declare_expert_bytes(prefix: str) -> None:
    """ctypes signature of a MoE family's ds4n_<prefix>_expert_bytes(model)."""
    fn = getattr(lib, f"ds4n_{prefix}_expert_bytes")
    fn.restype, fn.argtypes = ctypes.c_int64, [ctypes.c_void_p]


class MoEDecoderModel(DecoderModel):
    """Reads the shared hyper-parameters; a family then reads its extras, binds its tensors
    and builds its native model (whose ds4n_<prefix>_expert_bytes it must export)."""

    def __init__(self, gf: GGUFFile, pool: native.Pool) -> None:
        self.gf = gf
        self.pool = pool
        hp = self.hp = HParams(gf)
        self.n_layer = int(hp("block_count"))
        self.n_embd = int(hp("embedding_length"))
        self.n_head = int(hp("attention.head_count"))
        self.n_head_kv = int(hp("attention.head_count_kv", self.n_head))
        self.head_dim = int(hp("attention.key_length", self.n_embd // max(self.n_head, 1)))
        value_len = int(hp("attention.value_length", self.head_dim))
        self.n_rot = int(hp("rope.dimension_count", self.head_dim))
        self.rope_base = float(hp("rope.freq_base", 10000.0))
        self.rms_eps = float(hp("attention.layer_norm_rms_epsilon"))
        self.n_ctx_train = int(hp("context_length"))
        self.n_expert = int(hp("expert_count"))
        self.n_used = int(hp("expert_used_count"))
        self.n_ff_exp = int(hp("expert_feed_forward_length"))
        embd = gf.tensor("token_embd.weight")
        self.n_vocab = int(hp("vocab_size", embd.shape[1] if len(embd.shape) == 2 else 0))
        if (
            min(self.n_layer, self.n_embd, self.n_head, self.n_head_kv, self.n_ff_exp) <= 0
            or self.n_head % self.n_head_kv
            or value_len != self.head_dim
            or not 0 < self.n_rot <= self.head_dim
            or self.n_rot % 2
        ):
            raise ModelLoadError(
                f"unsupported {gf.architecture} shape: {self.n_head} heads / {self.n_head_kv}"
                f" kv heads, head dim {self.head_dim} (value {value_len}), rope dims"
                f" {self.n_rot}, expert width {self.n_ff_exp}"
            )
        if not 0 < self.n_used <= self.n_expert:
            raise ModelLoadError(
                f"{gf.architecture}: {self.n_used} experts used of {self.n_expert}"
            )

    def expert_shapes(self) -> dict[str, tuple[int, ...]]:
        """GGUF shapes (ne0 first) of the router and the expert tensors and biases."""
        E, F, n = self.n_embd, self.n_ff_exp, self.n_expert
        return {
            "ffn_gate_inp.weight": (E, n), "ffn_gate_inp.bias": (n,),
            "ffn_gate_exps.weight": (E, F, n), "ffn_up_exps.weight": (E, F, n),
            "ffn_down_exps.weight": (F, E, n), "ffn_gate_exps.bias": (F, n),
            "ffn_up_exps.bias": (F, n), "ffn_down_exps.bias": (E, n),
        }  # fmt: skip

    @property
    def expert_bytes(self) -> int:
        """Bytes of expert weights this model's evals have read (the router not counted)."""
        return int(getattr(lib, f"ds4n_{self.prefix}_expert_bytes")(self.handle))
