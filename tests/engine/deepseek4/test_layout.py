"""deepseek4 GGUF layout: the synthetic file validates; broken layouts are refused with
one clear line per problem; the generator is deterministic."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest
from gguf import GGMLQuantizationType as T

from ds4d.engine import deepseek4_layout as L
from ds4d.engine.errors import ModelLoadError
from ds4d.tools.synth import SYNTH_PARAMS, write_deepseek4


@pytest.fixture(scope="module")
def synth_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("ds4") / "synth.gguf"
    write_deepseek4(path, seed=1)
    return path


def test_synthetic_file_validates(synth_path):
    layout = L.load(synth_path)
    p = layout.params
    assert layout.synthetic and layout.expert == "q2"
    assert p.compress_ratios == (0, 0, 4, 128, 4)
    assert p.n_embd == SYNTH_PARAMS.n_embd and p.n_vocab == SYNTH_PARAMS.n_vocab
    assert layout.tensors["blk.4.ffn_gate_exps.weight"].type == T.IQ2_XXS
    assert layout.tensors["blk.4.ffn_down_exps.weight"].type == T.Q2_K
    assert list(layout.tensors["blk.3.attn_compressor_ape.weight"].shape) == [128, 128]
    assert list(layout.tensors["blk.2.attn_compressor_ape.weight"].shape) == [256, 4]
    assert "blk.2.ffn_gate_tid2eid.weight" in layout.tensors
    assert "blk.3.ffn_gate_tid2eid.weight" not in layout.tensors
    assert "blk.3.indexer.proj.weight" not in layout.tensors


def test_q4_expert_variant_validates(tmp_path):
    path = tmp_path / "q4.gguf"
    write_deepseek4(path, seed=2, experts="q4")
    assert L.load(path).expert == "q4"


def test_real_shape_required_without_synthetic_marker(synth_path, tmp_path):
    # renaming the key (same length, so the file stays consistent) removes the marker
    data = synth_path.read_bytes()
    marker = L.SYNTHETIC_KEY.encode()
    assert data.count(marker) == 1
    unmarked = tmp_path / "unmarked.gguf"
    unmarked.write_bytes(data.replace(marker, marker[:-1] + b"X"))
    with pytest.raises(L.DS4LayoutError) as e:
        L.load(unmarked)
    assert "hyper-parameter n_embd: 256, the DeepSeek V4 Flash shape is 4096" in e.value.problems


def _broken(tmp_path, mutate) -> list[str]:
    specs = list(L.expected_tensors(SYNTH_PARAMS, "q2"))
    specs = [s for s in specs if not s.optional or int(s.name.split(".")[1]) >= 3]
    path = tmp_path / "bad.gguf"
    write_deepseek4(path, seed=3, specs=mutate(specs))
    with pytest.raises(ModelLoadError) as e:
        L.load(path)
    return str(e.value).splitlines()


def test_missing_tensor_refused(tmp_path):
    lines = _broken(tmp_path, lambda s: [x for x in s if x.name != "blk.3.attn_kv.weight"])
    assert len(lines) == 1
    assert lines[0].endswith(": not a valid deepseek4 GGUF: tensor blk.3.attn_kv.weight: missing")


def test_wrong_shape_and_type_refused(tmp_path):
    def mutate(specs):
        out = []
        for s in specs:
            if s.name == "blk.2.attn_sinks.weight":
                s = dataclasses.replace(s, dims=(8,))
            if s.name == "output.weight":
                s = dataclasses.replace(s, types=(T.F16,))
            out.append(s)
        return out + [L.TensorSpec("blk.4.extra.weight", (4,), (T.F32,))]

    lines = _broken(tmp_path, mutate)
    assert lines[0].endswith(
        ": not a valid deepseek4 GGUF: tensor output.weight: type F16, expected Q8_0"
        " (and 2 more below)"
    )
    assert lines[1:] == [
        "tensor blk.2.attn_sinks.weight: dims [8], expected [4]",
        "tensor blk.4.extra.weight: not part of the deepseek4 layout",
    ]


def test_truncated_file_refused(synth_path, tmp_path):
    data = synth_path.read_bytes()
    bad = tmp_path / "cut.gguf"
    bad.write_bytes(data[: len(data) - 4096])
    with pytest.raises(ModelLoadError) as e:
        L.load(bad)
    assert "truncated" in str(e.value) or "cannot read" in str(e.value)


def test_other_architecture_refused(model_path):
    with pytest.raises(L.DS4LayoutError) as e:
        L.load(model_path)
    assert e.value.problems == ["general.architecture is 'llama', expected 'deepseek4'"]


def test_cli_is_deterministic(tmp_path):
    paths = [tmp_path / f"{i}.gguf" for i in range(3)]
    for path, seed in zip(paths, (7, 7, 8), strict=True):
        cmd = [
            sys.executable,
            "-m",
            "ds4d",
            "synth-gguf",
            "--family",
            "deepseek4",
            "-o",
            str(path),
            "--seed",
            str(seed),
        ]
        subprocess.run(cmd, check=True, capture_output=True)
    assert paths[0].read_bytes() == paths[1].read_bytes()
    assert paths[0].read_bytes() != paths[2].read_bytes()
    assert paths[0].stat().st_size < 10_000_000


def test_released_shape_is_consistent():
    problems: list[str] = []
    L.check_params(L.DS4_FLASH, synthetic=False, problems=problems)
    assert problems == []
    specs = list(L.expected_tensors(L.DS4_FLASH, "q2"))
    per_layer = [sum(s.name.startswith(f"blk.{il}.") for s in specs) for il in range(43)]
    # 23 base tensors (+ optional router bias), +4 compressor, +6 indexer, +1 hash table
    assert per_layer[:4] == [24 + 1, 24 + 1, 24 + 4 + 6 + 1, 24 + 4]
    size = sum(L.tensor_nbytes(s.types[0], s.dims) for s in specs)
    assert 84e9 < size < 88e9  # the q2 file is about 86 GB


def test_full_size_file_opens_without_reading_weights(tmp_path):
    """An 86 GB file (sparse: holes, no disk) opens on this 24 GB machine: validation,
    binding and a session allocate well under 1.5 GB, so no weight is read."""
    from ds4d.tools.synth import write_sparse_full_size

    path = tmp_path / "full.gguf"
    size = write_sparse_full_size(path)
    assert size > 80e9
    code = (
        "import resource, sys\n"
        "from ds4d.engine.engine import Engine\n"
        "e = Engine.open(sys.argv[1], threads=1)\n"
        "s = e.new_session(4096)\n"
        "print(e.info.family, e.info.n_layer, e.info.file_bytes,"
        " resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)\n"
    )
    out = subprocess.run([sys.executable, "-c", code, str(path)], check=True,
                         capture_output=True, text=True).stdout.split()  # fmt: skip
    assert out[:3] == ["deepseek4", "43", str(size)]
    assert int(out[3]) < 1_500_000  # KiB


def test_open_never_builds_the_slow_gguf_reader(synth_path):
    """Validation and the tokenizer read GGUFFile's own index: gguf.GGUFReader (seconds of
    per-element objects for a real vocabulary) is never built."""
    from ds4d.engine import deepseek4
    from ds4d.engine.gguf_file import GGUFFile

    gf = GGUFFile(synth_path)
    layout = L.validate(gf)
    tok = deepseek4.make_tokenizer(gf)
    assert layout.params.n_vocab == SYNTH_PARAMS.n_vocab
    assert tok.encode("Hello") and gf._reader is None
