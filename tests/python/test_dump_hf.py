"""dump_hf: Q/K/V capture with forward hooks, on stub models in pure NumPy that
mimic the interface used (named_modules, register_forward_hook, a forward
call, tensors with .detach().cpu().float().numpy()). CI has no torch; the one
test that needs torch + transformers skips without them."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from typing import Dict, List, Optional

import numpy as np
import pytest

from kvselect.dump_hf import DumpError, dump_qkv, main, save
from kvselect.workloads import load_npz

HID, T = 16, 12


class StubTensor:
    """The slice of the torch.Tensor interface the dumper touches."""

    def __init__(self, a: np.ndarray):
        self.a = np.asarray(a)
        self.shape = self.a.shape

    def detach(self) -> "StubTensor":
        return self

    def cpu(self) -> "StubTensor":
        return self

    def float(self) -> "StubTensor":
        return StubTensor(self.a.astype(np.float32))

    def numpy(self) -> np.ndarray:
        return self.a


class Handle:
    def __init__(self, hooks: list, fn):
        self.hooks, self.fn = hooks, fn

    def remove(self) -> None:
        self.hooks.remove(self.fn)


class Module:
    def __init__(self) -> None:
        self._hooks: list = []
        self._children: Dict[str, "Module"] = {}

    def add(self, name: str, child: "Module") -> "Module":
        self._children[name] = child
        return child

    def named_modules(self, prefix: str = ""):
        yield prefix, self
        for name, child in self._children.items():
            yield from child.named_modules(f"{prefix}.{name}" if prefix else name)

    def register_forward_hook(self, fn) -> Handle:
        self._hooks.append(fn)
        return Handle(self._hooks, fn)

    def __call__(self, *args):
        out = self.forward(*args)
        for fn in list(self._hooks):
            fn(self, args, out)
        return out


class Linear(Module):
    def __init__(self, w: np.ndarray, b: np.ndarray):
        super().__init__()
        self.w, self.b = w, b

    def forward(self, x: StubTensor) -> StubTensor:
        return StubTensor(x.a @ self.w + self.b)


class HeadNorm(Module):
    """Per-head RMS norm on [1, T, H, D], as Qwen3's q_norm."""

    def forward(self, x: StubTensor) -> StubTensor:
        a = x.a
        return StubTensor(a / np.sqrt((a * a).mean(-1, keepdims=True) + 1e-6))


class Rotary(Module):
    """The Hugging Face table: cos/sin of cat(freqs, freqs), [1, T, rot]."""

    def __init__(self, rot: int):
        super().__init__()
        self.rot = rot

    def forward(self, x: StubTensor, positions: np.ndarray):
        inv = 1.0 / (10000 ** (np.arange(0, self.rot, 2) / self.rot))
        freqs = positions[:, None] * inv[None, :]
        emb = np.concatenate([freqs, freqs], axis=-1)[None]
        return StubTensor(np.cos(emb)), StubTensor(np.sin(emb))


class Attention(Module):
    def __init__(self, names, rng, heads, kv, d, *, norms=False, rotary: Optional[Rotary] = None, scaling=None):
        super().__init__()
        qn, kn, vn = names
        mk = lambda out: Linear(rng.standard_normal((HID, out)), rng.standard_normal(out))  # noqa: E731
        self.q = self.add(qn, mk(heads * d))
        self.k = self.add(kn, mk(kv * d))
        self.v = self.add(vn, mk(kv * d))
        self.o = self.add("o_proj", mk(HID))
        self.heads, self.kv, self.d = heads, kv, d
        self.norms = norms
        if norms:
            self.q_norm = self.add("q_norm", HeadNorm())
            self.k_norm = self.add("k_norm", HeadNorm())
        self.rotary = self.add("rotary_emb", rotary) if rotary is not None else None
        if scaling is not None:
            self.scaling = scaling

    def forward(self, x: StubTensor, pos_emb=None) -> StubTensor:
        q, k, v = self.q(x), self.k(x), self.v(x)
        if self.norms:
            q = self.q_norm(StubTensor(q.a.reshape(1, T, self.heads, self.d)))
            k = self.k_norm(StubTensor(k.a.reshape(1, T, self.kv, self.d)))
        if self.rotary is not None:
            self.rotary(x, np.arange(T, dtype=np.float64))
        # no real attention needed: the dump reads the projections only
        return StubTensor(x.a + 0.01 * np.tanh(v.a.reshape(1, T, -1)[..., :1]))


class Model(Module):
    def __init__(
        self,
        layers=2,
        heads=4,
        kv=2,
        d=4,
        names=("q_proj", "k_proj", "v_proj"),
        norms=False,
        rotary: str = "none",
        scaling=None,
        seed=0,
    ):
        super().__init__()
        rng = np.random.default_rng(seed)
        self.embed = rng.standard_normal((50, HID))
        self.shared_rotary = self.add("rotary_emb", Rotary(d)) if rotary == "model" else None
        body = self.add("layers", Module())
        self.attn: List[Attention] = []
        for i in range(layers):
            layer = body.add(str(i), Module())
            rot = Rotary(d) if rotary == "layer" else None
            self.attn.append(
                layer.add("self_attn", Attention(names, rng, heads, kv, d, norms=norms, rotary=rot, scaling=scaling))
            )

    def forward(self, input_ids: np.ndarray):
        x = StubTensor(self.embed[np.asarray(input_ids)])
        if self.shared_rotary is not None:
            self.shared_rotary(x, np.arange(T, dtype=np.float64))
        self.inputs = []
        for attn in self.attn:
            self.inputs.append(x.a)
            x = attn(x)
        return x


IDS = np.arange(T)[None] % 50


def expected(model: Model, layer: int, which: str) -> np.ndarray:
    """[heads, T, d] from the stub's known weights and recorded inputs."""
    attn = model.attn[layer]
    lin = {"q": attn.q, "k": attn.k, "v": attn.v}[which]
    heads = attn.heads if which == "q" else attn.kv
    out = model.inputs[layer][0] @ lin.w + lin.b
    return out.reshape(T, heads, -1).transpose(1, 0, 2)


def rope(x: np.ndarray, rot: int) -> np.ndarray:
    """Independent reference: rotate pairs (j, j + rot/2) by position * inv_freq_j."""
    inv = 1.0 / (10000 ** (np.arange(0, rot, 2) / rot))
    ang = np.arange(T)[:, None] * inv[None, :]
    c = np.cos(ang) + 1j * np.sin(ang)
    half = rot // 2
    z = (x[..., :half] + 1j * x[..., half:rot]) * c[None]
    return np.concatenate([z.real, z.imag, x[..., rot:]], axis=-1)


# --------------------------------------------------------------------------------


def test_dump_qkv_captures_the_gqa_projections_of_every_layer():
    model = Model(layers=3, heads=4, kv=2, d=4)
    out = dump_qkv(model, IDS, num_heads=4, num_kv_heads=2, head_dim=4)
    assert out["q"].shape == (3, 4, T, 4) and out["k"].shape == out["v"].shape == (3, 2, T, 4)
    assert out["q"].dtype == np.float32
    np.testing.assert_array_equal(out["layer_ids"], [0, 1, 2])
    for layer in range(3):
        for which in "qkv":
            np.testing.assert_allclose(out[which][layer], expected(model, layer, which), rtol=1e-5, atol=1e-5)
    assert "scale" not in out


def test_dump_qkv_removes_its_hooks_even_when_it_fails():
    model = Model()
    dump_qkv(model, IDS, num_heads=4, num_kv_heads=2, head_dim=4)
    assert all(not m._hooks for _, m in model.named_modules())
    with pytest.raises(DumpError, match="expected head_dim 8, got q 4"):
        dump_qkv(model, IDS, num_heads=4, num_kv_heads=2, head_dim=8)
    assert all(not m._hooks for _, m in model.named_modules())

    def broken(input_ids):
        raise RuntimeError("forward failed")

    model.forward = broken
    with pytest.raises(RuntimeError, match="forward failed"):
        dump_qkv(model, IDS, num_heads=4, num_kv_heads=2, head_dim=4)
    assert all(not m._hooks for _, m in model.named_modules())


def test_dump_qkv_selects_layers_by_index_and_records_their_ids():
    model = Model(layers=3)
    out = dump_qkv(model, IDS, num_heads=4, num_kv_heads=2, head_dim=4, layers=[2, 0])
    np.testing.assert_array_equal(out["layer_ids"], [2, 0])
    np.testing.assert_allclose(out["k"][0], expected(model, 2, "k"), rtol=1e-5, atol=1e-5)
    with pytest.raises(DumpError, match=r"layers: expected distinct indices in \[0, 3\)"):
        dump_qkv(model, IDS, num_heads=4, num_kv_heads=2, head_dim=4, layers=[3])


def test_dump_qkv_understands_bert_style_query_key_value_names():
    model = Model(heads=2, kv=2, names=("query", "key", "value"))
    out = dump_qkv(model, IDS, num_heads=2, num_kv_heads=2, head_dim=4)
    np.testing.assert_allclose(out["q"][1], expected(model, 1, "q"), rtol=1e-5, atol=1e-5)


def test_dump_qkv_names_the_modules_it_looked_for_when_none_match():
    model = Model(names=("qkv_a", "qkv_b", "qkv_c"))
    with pytest.raises(DumpError, match="q_proj/k_proj/v_proj, query/key/value"):
        dump_qkv(model, IDS, num_heads=4, num_kv_heads=2, head_dim=4)


def test_dump_qkv_applies_a_model_level_rotary_embedding_in_the_hf_convention():
    model = Model(rotary="model", d=8, heads=2, kv=1)
    out = dump_qkv(model, IDS, num_heads=2, num_kv_heads=1, head_dim=8)
    for which in "qk":
        np.testing.assert_allclose(out[which][0], rope(expected(model, 0, which), 8), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(out["v"][0], expected(model, 0, "v"), rtol=1e-5, atol=1e-5)  # v is not rotated
    raw = dump_qkv(model, IDS, num_heads=2, num_kv_heads=1, head_dim=8, rotary=False)
    np.testing.assert_allclose(raw["q"][0], expected(model, 0, "q"), rtol=1e-5, atol=1e-5)


def test_dump_qkv_applies_per_layer_rotary_and_partial_rotary_dims():
    model = Model(rotary="layer", d=8, heads=2, kv=2)
    for attn in model.attn:
        attn.rotary.rot = 4  # rotate the first half of each head only (partial rotary)
    out = dump_qkv(model, IDS, num_heads=2, num_kv_heads=2, head_dim=8)
    np.testing.assert_allclose(out["k"][1], rope(expected(model, 1, "k"), 4), rtol=1e-4, atol=1e-4)


def test_dump_qkv_refuses_to_guess_between_several_model_level_rotary_modules():
    model = Model(rotary="model")
    model.add("rotary_emb_local", Rotary(4)).add("rotary_emb", Rotary(4))
    with pytest.raises(DumpError, match="rotary: expected one model-level 'rotary_emb'"):
        dump_qkv(model, IDS, num_heads=4, num_kv_heads=2, head_dim=4)


def test_dump_qkv_takes_q_norm_and_k_norm_outputs_and_the_attention_scaling():
    model = Model(norms=True, scaling=0.3)
    out = dump_qkv(model, IDS, num_heads=4, num_kv_heads=2, head_dim=4)
    raw = expected(model, 0, "q")
    normed = raw / np.sqrt((raw * raw).mean(-1, keepdims=True) + 1e-6)
    np.testing.assert_allclose(out["q"][0], normed, rtol=1e-4, atol=1e-4)
    assert float(out["scale"]) == 0.3


def test_dump_qkv_refuses_a_batch_and_heads_that_do_not_group():
    model = Model()
    with pytest.raises(DumpError, match=r"input_ids: expected shape \[1, tokens >= 2\]"):
        dump_qkv(model, np.zeros((2, T), int), num_heads=4, num_kv_heads=2, head_dim=4)
    with pytest.raises(DumpError, match="num_heads = 4 is not a multiple of num_kv_heads = 3"):
        dump_qkv(model, IDS, num_heads=4, num_kv_heads=3, head_dim=4)


def test_saved_dump_reads_back_with_load_npz(tmp_path):
    model = Model(layers=2, heads=4, kv=2, d=4, scaling=0.4)
    arrays = dump_qkv(model, IDS, num_heads=4, num_kv_heads=2, head_dim=4, layers=[1])
    path = save(tmp_path / "dump", arrays)
    assert path.name == "dump.npz"
    assert np.load(path)["q"].dtype == np.float16
    w = load_npz(path, queries=4)
    assert w.q.shape == (4, T, 4) and w.k.shape == (2, T, 4) and w.group == 2
    assert w.head_kinds == ("L1/H0", "L1/H1") and w.scale == pytest.approx(0.4)
    np.testing.assert_allclose(w.q, arrays["q"][0], rtol=1e-3, atol=1e-2)  # float16 storage


def test_save_refuses_values_that_overflow_float16_and_keeps_them_in_float32(tmp_path):
    arrays = {
        "q": np.full((1, 1, 2, 2), 1e6, np.float32),
        "k": np.ones((1, 1, 2, 2), np.float32),
        "v": np.ones((1, 1, 2, 2), np.float32),
    }
    with pytest.raises(DumpError, match="do not fit float16"):
        save(tmp_path / "x.npz", arrays)
    assert np.load(save(tmp_path / "x.npz", arrays, dtype="float32"))["q"].max() == 1e6


def test_importing_dump_hf_does_not_import_torch_or_transformers():
    code = "import sys, kvselect.dump_hf; sys.exit(int('torch' in sys.modules or 'transformers' in sys.modules))"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


@pytest.mark.skipif(importlib.util.find_spec("torch") is not None, reason="torch is installed")
def test_cli_without_torch_says_what_to_install(tmp_path, capsys):
    text = tmp_path / "t.txt"
    text.write_text("hello")
    assert main([str(tmp_path), str(text), str(tmp_path / "o.npz")]) == 2
    assert "needs torch and transformers" in capsys.readouterr().err


@pytest.mark.skipif(
    importlib.util.find_spec("torch") is None or importlib.util.find_spec("transformers") is None,
    reason="needs torch and transformers",
)
def test_dump_of_a_tiny_llama_reproduces_its_own_attention():
    import torch
    from transformers import LlamaConfig, LlamaModel

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    model = LlamaModel(cfg).eval()
    model.config._attn_implementation = "eager"
    ids = torch.arange(20)[None] % 64
    with torch.no_grad():
        arrays = dump_qkv(model, ids, num_heads=4, num_kv_heads=2, head_dim=8)
        attn = model(ids, output_attentions=True).attentions
    q, k = arrays["q"], arrays["k"]
    scale = float(arrays.get("scale", 8**-0.5))
    for layer in range(2):
        kk = np.repeat(k[layer], 2, axis=0)
        logits = np.einsum("hid,hjd->hij", q[layer], kk) * scale
        logits = np.where(np.tril(np.ones((20, 20), bool)), logits, -np.inf)
        p = np.exp(logits - logits.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        np.testing.assert_allclose(p, attn[layer][0].numpy(), atol=1e-4)


def test_save_writes_a_workload_dump_uncompressed_with_the_api_names(tmp_path):
    import zipfile

    from kvselect.checking import load_dump

    rng = np.random.default_rng(3)
    arrays = {
        "q": rng.standard_normal((1, 2, 8, 4)).astype(np.float32),
        "k": rng.standard_normal((1, 1, 8, 4)).astype(np.float32),
        "v": rng.standard_normal((1, 1, 8, 4)).astype(np.float32),
        "index_q": rng.standard_normal((1, 8, 3, 4)).astype(np.float32),
        "weights": rng.uniform(0.5, 1.5, (1, 8, 3)).astype(np.float32),
        "index_k": rng.standard_normal((1, 8, 4)).astype(np.float32),
        "key_scale": rng.uniform(0.5, 2, (1, 8)).astype(np.float32),
    }
    path = save(tmp_path / "dsa.npz", arrays)
    with zipfile.ZipFile(path) as z:
        assert {i.compress_type for i in z.infolist()} == {zipfile.ZIP_STORED}
    d = load_dump(path)
    assert d.kind == "workload" and isinstance(d["q"], np.memmap)
    assert d["weights"].dtype == np.float32 and d["key_scale"].dtype == np.float32
    assert load_npz(path).indexer is not None


def test_save_refuses_an_old_key_name_suggesting_the_api_name(tmp_path):
    arrays = {
        "q": np.ones((1, 1, 2, 2), np.float32),
        "k": np.ones((1, 1, 2, 2), np.float32),
        "v": np.ones((1, 1, 2, 2), np.float32),
        "index_k_scale": np.ones((1, 2), np.float32),
    }
    with pytest.raises(DumpError, match="did you mean 'key_scale'"):
        save(tmp_path / "old.npz", arrays)
    assert not (tmp_path / "old.npz").exists()


def test_save_in_bfloat16_stores_raw_bits_with_their_format_rounded_to_nearest(tmp_path):
    from kvselect.checking import load_dump

    q = np.array([1.0, 1.00390625, 1.01171875, -3.0], np.float32).reshape(1, 1, 2, 2)
    arrays = {"q": q, "k": np.ones((1, 1, 2, 2), np.float32), "v": np.ones((1, 1, 2, 2), np.float32)}
    path = save(tmp_path / "bf.npz", arrays, dtype="bfloat16")
    d = load_dump(path)
    assert d.formats["q"] == "bfloat16" and d["q"].dtype == np.uint16
    # Both are ties (bfloat16 steps by 2^-7 at 1): to even, 1.0 and 1 + 2^-6.
    np.testing.assert_array_equal(d.floats("q").reshape(-1), [1.0, 1.0, 1.015625, -3.0])
