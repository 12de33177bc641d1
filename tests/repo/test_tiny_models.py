"""离线小模型：真 transformers 配置、确定、随机化了 norm 和 bias、两种 config.json 形式都有。"""

import hashlib
import json

import torch
from transformers import AutoConfig, AutoTokenizer

from tests.harness.reference import hf_tensors
from tools.models.make_tiny_models import FAMILIES, make_all


def _digest(path):
    h = hashlib.sha256()
    for f in sorted(p for p in path.rglob("*") if p.is_file()):
        h.update(f.relative_to(path).as_posix().encode() + f.read_bytes())
    return h.hexdigest()


def test_deterministic(tmp_path, tiny_models):
    fresh = make_all(tmp_path, ["qwen3-untied"])["qwen3-untied"]
    assert _digest(fresh) == _digest(tiny_models["qwen3-untied"])


def test_tokenizer_loads_and_round_trips(tiny_models):
    for path in tiny_models.values():
        tok = AutoTokenizer.from_pretrained(path)
        for text in ["The capital of France is", "法国的首都是巴黎。", "def f(x):\n    return x"]:
            assert tok.decode(tok(text).input_ids) == text


def test_families_have_the_features_we_test(tiny_models):
    cfg = {name: AutoConfig.from_pretrained(path) for name, path in tiny_models.items()}
    assert set(cfg) == set(FAMILIES)
    t = cfg["qwen3-tied"]
    assert t.tie_word_embeddings and t.num_key_value_heads < t.num_attention_heads
    u = cfg["qwen3-untied"]
    assert not u.tie_word_embeddings and u.num_key_value_heads == 1
    assert u.head_dim != u.hidden_size // u.num_attention_heads
    assert (tiny_models["qwen3-untied"] / "model.safetensors.index.json").exists()
    assert len(list(tiny_models["qwen3-untied"].glob("*.safetensors"))) > 1
    assert cfg["qwen2"].model_type == "qwen2" and not cfg["qwen2"].tie_word_embeddings
    assert cfg["llama3"].rope_parameters["rope_type"] == "llama3"
    assert cfg["llama3"].num_key_value_heads < cfg["llama3"].num_attention_heads


def test_both_config_json_forms(tiny_models):
    raw = {name: json.loads((p / "config.json").read_text()) for name, p in tiny_models.items()}
    hub = [n for n, c in raw.items() if "rope_theta" in c and "torch_dtype" in c and "rope_parameters" not in c]
    new = [n for n, c in raw.items() if "rope_parameters" in c and "rope_theta" not in c]
    assert "qwen3-untied" in hub and "llama3" in hub and raw["llama3"]["rope_scaling"]["rope_type"] == "llama3"
    assert "qwen3-tied" in new and "qwen2" in new


def test_norms_and_biases_are_not_defaults(tiny_models):
    for name, path in tiny_models.items():
        w = hf_tensors(path)
        norms = [k for k in w if k.endswith("norm.weight")]
        assert norms and all(not torch.allclose(w[k], torch.ones_like(w[k])) for k in norms), name
        for k in (k for k in w if k.endswith(".bias")):
            assert w[k].abs().min() > 0, k
    assert any(k.endswith("q_proj.bias") for k in hf_tensors(tiny_models["qwen2"]))
    assert "lm_head.weight" not in hf_tensors(tiny_models["qwen3-tied"])
    assert "lm_head.weight" in hf_tensors(tiny_models["qwen3-untied"])


# ---------------------------------------------------------------- 小模型改变 decoder 读的每个 config 字段

def _fields_read(ck) -> set[str]:
    """这一章的 ModelConfig.from_hf 从 HF 配置读的字段（config.X、getattr(config, "X")、rope.get("X")），
    加上 RoPE 从缩放字典里读的键（scaling["X"]、.get("X")）。"""
    import ast

    out = set()
    cfg = ast.parse((ck.path / "minisgl/models/config.py").read_text(encoding="utf-8"))
    rot = ast.parse((ck.path / "minisgl/layers/rotary.py").read_text(encoding="utf-8"))
    from_hf = next(n for n in ast.walk(cfg) if isinstance(n, ast.FunctionDef) and n.name == "from_hf")
    for n in ast.walk(from_hf):
        if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "config":
            out.add(n.attr)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "getattr" \
                and ast.unparse(n.args[0]) == "config" and isinstance(n.args[1], ast.Constant):
            out.add(n.args[1].value)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "get" \
                and ast.unparse(n.func.value) == "rope" and isinstance(n.args[0], ast.Constant):
            out.add(n.args[0].value)
    for n in ast.walk(rot):
        if isinstance(n, ast.Subscript) and "scaling" in ast.unparse(n.value) and isinstance(n.slice, ast.Constant):
            out.add(n.slice.value)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "get" \
                and "scaling" in ast.unparse(n.func.value) and isinstance(n.args[0], ast.Constant):
            out.add(n.args[0].value)
    return out


def _value(name, path, field):
    c = AutoConfig.from_pretrained(path)
    if field == "head_dim":
        return getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    rope = dict(getattr(c, "rope_parameters", None) or {})
    if field in rope or field in ("rope_type", "factor", "low_freq_factor", "high_freq_factor",
                                  "original_max_position_embeddings"):
        return rope.get(field)
    if field.startswith("attention_bias"):
        return any(k.endswith("q_proj.bias") for k in hf_tensors(path))
    return getattr(c, field)


def test_every_config_field_the_decoder_reads_has_a_row():
    from tools.manifest import load_manifest
    from tools.models.make_tiny_models import FIELD_COVERAGE, NOT_VARIED

    rows = set(FIELD_COVERAGE) | set(NOT_VARIED)
    for ck in (c for c in load_manifest() if c.chapter >= 3):
        missing = _fields_read(ck) - rows
        assert not missing, (f"{ck.name} 的 decoder 读了 {sorted(missing)}，"
                             "tools/models/make_tiny_models.py 的 FIELD_COVERAGE "
                             "里却没有一行说哪个小模型改了它、哪个测试抓它")


def test_each_row_names_models_that_really_differ_and_a_test_that_exists(tiny_models):
    from tools.manifest import ROOT
    from tools.models.make_tiny_models import FIELD_COVERAGE, LLAMA31_SCALING, NOT_VARIED

    for field, (models, test) in FIELD_COVERAGE.items():
        base = _value("qwen3-tied", tiny_models["qwen3-tied"], field)
        assert models, field
        for name in models:
            assert _value(name, tiny_models[name], field) != base, \
                f"{field}：{name} 和 qwen3-tied 取的值一样（{base!r}）"
    for field, want in LLAMA31_SCALING.items():
        assert _value("llama3", tiny_models["llama3"], field) != want, f"llama3 的 {field} 不能取 Llama 3.1 的 {want}"
    for _, test in [*FIELD_COVERAGE.values(), *NOT_VARIED.values()]:
        file, func = test.split("::")
        assert f"def {func}(" in (ROOT / file).read_text(encoding="utf-8"), test


def test_the_field_table_is_on_the_testing_page():
    from tools.manifest import ROOT
    from tools.models.make_tiny_models import FIELD_COVERAGE

    rows = [line for line in (ROOT / "docs" / "testing.md").read_text(encoding="utf-8").splitlines()
            if line.startswith("| `")]
    for field, (models, test) in FIELD_COVERAGE.items():
        row = next((r for r in rows if r.startswith(f"| `{field.split(' ')[0]}`")), None)
        assert row is not None, f"docs/testing.md 的字段表里没有 {field}"
        assert all(m in row for m in models) and test.split("::")[-1] in row, (field, row)


def test_realistic_scale_model_makes_eps_matter(tiny_models):
    """真实尺度（initializer_range 0.02）的小模型上，eps 从 1e-5 换成 1e-6，logits 的变化远大于对齐测试的容差。"""
    from tests.harness.reference import load_hf
    from tests.harness.report import LOGITS_RTOL

    path = tiny_models["qwen3-untied"]
    assert AutoConfig.from_pretrained(path).initializer_range == 0.02
    model, tok = load_hf(str(path))
    ids = torch.tensor([tok("The capital of France is").input_ids])
    norms = [m for m in model.modules() if hasattr(m, "variance_epsilon")]
    with torch.inference_mode():
        a = model(ids).logits[0, -1]
        for m in norms:
            m.variance_epsilon, m._saved = 1e-6, m.variance_epsilon
        try:
            b = model(ids).logits[0, -1]
        finally:
            for m in norms:
                m.variance_epsilon = m._saved
    assert float((a - b).abs().max()) > 10 * LOGITS_RTOL * float(a.abs().max())
