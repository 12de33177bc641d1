"""离线小模型：真 transformers 配置、确定、随机化了 norm 和 bias、两种 config.json 形式都有。"""

import hashlib
import json

import torch
from transformers import AutoConfig, AutoTokenizer

from tests.harness.reference import hf_tensors
from tools.make_tiny_models import FAMILIES, make_all


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
