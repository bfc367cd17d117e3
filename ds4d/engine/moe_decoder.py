"""What the MoE decoder families (qwen3moe.py, gptoss.py) share on the Python side, beside
decoder.py's binding and session state: the expert hyper-parameters every such file carries
(native/moe_decoder.h's ds4n_moe_experts), the shapes of the router and expert tensors, and
the model's count of expert bytes read (native/moe.h's counter)."""

from __future__ import annotations

import ctypes

from ds4d.engine import native
from ds4d.engine.decoder import DecoderModel, DenseShape
from ds4d.engine.errors import ModelLoadError
from ds4d.engine.gguf_file import GGUFFile
from ds4d.engine.native import lib

lib.ds4n_moe_decoder_expert_bytes.restype = ctypes.c_int64
lib.ds4n_moe_decoder_expert_bytes.argtypes = [ctypes.c_void_p]


class ExpertsC(ctypes.Structure):
    """struct ds4n_moe_experts (native/moe_decoder.h)."""

    _fields_ = [
        *[(n, ctypes.c_int32) for n in ("n_expert", "n_used", "n_ff")],
        ("weights_scale", ctypes.c_float),
    ]  # fmt: skip


class MoEDecoderModel(DecoderModel):
    """Reads the shared hyper-parameters; a family then reads its extras and opens its
    native model, built on native/moe_decoder.h."""

    def __init__(self, gf: GGUFFile, pool: native.Pool) -> None:
        sh = DenseShape(gf, gf.architecture, rope_even_head=False, experts=True)
        super().__init__(gf, pool, sh)
        hp = self.hp = sh.hp
        self.n_expert = int(hp("expert_count"))
        self.n_used = int(hp("expert_used_count"))
        self.n_ff_exp = int(hp("expert_feed_forward_length"))
        self.weights_scale = float(hp("expert_weights_scale", 0.0))
        if self.n_ff_exp <= 0:
            raise ModelLoadError(f"{gf.architecture}: expert width {self.n_ff_exp}")
        if not 0 < self.n_used <= self.n_expert:
            raise ModelLoadError(
                f"{gf.architecture}: {self.n_used} experts used of {self.n_expert}"
            )

    def c_experts(self) -> ExpertsC:
        return ExpertsC(self.n_expert, self.n_used, self.n_ff_exp, self.weights_scale)

    def tensor_shapes(self) -> dict[str, tuple[int, ...]]:
        """decoder.DenseShape's standard shapes, with the router and the expert tensors and
        biases (GGUF order, ne0 first)."""
        E, F, n = self.n_embd, self.n_ff_exp, self.n_expert
        return {
            **self.shape.tensor_shapes(),
            "ffn_gate_inp.weight": (E, n), "ffn_gate_inp.bias": (n,),
            "ffn_gate_exps.weight": (E, F, n), "ffn_up_exps.weight": (E, F, n),
            "ffn_down_exps.weight": (F, E, n), "ffn_gate_exps.bias": (F, n),
            "ffn_up_exps.bias": (F, n), "ffn_down_exps.bias": (E, n),
        }  # fmt: skip

    @property
    def expert_bytes(self) -> int:
        """Bytes of expert weights this model's evals have read (the router not counted)."""
        return int(lib.ds4n_moe_decoder_expert_bytes(self.handle))
