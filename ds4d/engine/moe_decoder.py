"""What the MoE decoder families (qwen3moe.py, gptoss.py) share on the Python side, beside
decoder.py's binding and session state: the attention and expert hyper-parameters every
such file carries, the shapes of the router and expert tensors, and the model's count of
expert bytes read (native/moe.h's counter)."""

from __future__ import annotations

import ctypes

from ds4d.engine import native
from ds4d.engine.decoder import DecoderModel, DenseShape
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
        sh = DenseShape(gf, gf.architecture, rope_even_head=False, experts=True)
        hp = self.hp = sh.hp
        self.n_layer, self.n_embd, self.n_vocab = sh.n_layer, sh.n_embd, sh.n_vocab
        self.n_head, self.n_head_kv, self.head_dim = sh.n_head, sh.n_head_kv, sh.head_dim
        self.n_rot, self.rope_base, self.rms_eps = sh.n_rot, sh.rope_base, sh.rms_eps
        self.n_ctx_train = sh.n_ctx_train
        self.n_expert = int(hp("expert_count"))
        self.n_used = int(hp("expert_used_count"))
        self.n_ff_exp = int(hp("expert_feed_forward_length"))
        if self.n_ff_exp <= 0:
            raise ModelLoadError(f"{gf.architecture}: expert width {self.n_ff_exp}")
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
