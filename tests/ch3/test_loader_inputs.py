"""第 3 章起：HF 不会读、不会接受的输入，我们也不读、不接受（issue 15）。

- 没有索引的目录只读 model.safetensors，有索引只读索引列出的分片；分片之间重复的键拒绝；
- 名叫 *.safetensors 的 FIFO、目录、设备：清楚地报错，绝不卡住；
- 用滑动窗口的配置拒绝；use_sliding_window=false 的（真的 Qwen2.5 大多如此）照常加载；
- config.json 比权重小（vocab_size、头数、intermediate_size）：拒绝，说出文件和张量；
- 分词器文件缺了、prompt 是空的：generate.py 说出是哪个。
"""

import json
import os
import shutil
import threading

import pytest
import torch
from safetensors.torch import load as load_safetensors_bytes
from safetensors.torch import save_file
from transformers import AutoConfig

from minisgl.models import ModelConfig, load_hf_config
from minisgl.utils import TOKENIZER_FILES, load_tokenizer
from tests.ch3.common import build_meta, config_of, load_into, op_of, refusals, stream
from tests.ch1.common import cli
from tests.harness.errors import check_error, expect_error, expect_exit


def copy_model(tiny_models, name, tmp_path):
    return shutil.copytree(tiny_models[name], tmp_path / name)


def edit_config(path, **changes):
    cfg = json.loads((path / "config.json").read_text())
    cfg.update(changes)
    for k in [k for k, v in changes.items() if v is None]:
        del cfg[k]
    (path / "config.json").write_text(json.dumps(cfg))


def add_to_file(file, tensors):
    data = load_safetensors_bytes(file.read_bytes())
    data.update(tensors)
    save_file(data, str(file))


def load(path, rank=0, size=1):
    config = config_of(path)
    model = build_meta(config, rank=rank, size=size)
    load_into(model, path, rank=rank, size=size)
    return model.state_dict()


def same_as_original(tiny_models, name, path):
    got, ref = load(path), load(tiny_models[name])
    return got.keys() == ref.keys() and all(torch.equal(got[k], ref[k]) for k in got)


# ---------------------------------------------------------------- 读哪些 safetensors 文件

def test_unindexed_dir_ignores_stray_safetensors(tiny_models, tmp_path):
    """多出来的 model_override.safetensors 里有个全 0 的 model.norm.weight：HF 不读它，我们也不读。"""
    path = copy_model(tiny_models, "qwen3-tied", tmp_path)
    save_file({"model.norm.weight": torch.zeros(64)}, str(path / "model_override.safetensors"))
    assert same_as_original(tiny_models, "qwen3-tied", path)


def test_task6_unindexed_dir_without_model_safetensors_is_refused(tiny_models, tmp_path):
    """没有 model.safetensors 也没有索引：HF 找不到权重；报错说出它要的名字和目录里那些不会被读的文件。"""
    path = copy_model(tiny_models, "qwen3-tied", tmp_path)
    (path / "model.safetensors").rename(path / "weights.safetensors")
    with expect_error("ch3/only_stray_safetensors", dir=path, stray="weights.safetensors"):
        stream(path, build_meta(config_of(path)))


def test_indexed_dir_ignores_unlisted_safetensors(tiny_models, tmp_path):
    path = copy_model(tiny_models, "qwen3-untied", tmp_path)
    assert (path / "model.safetensors.index.json").is_file()
    save_file({"model.norm.weight": torch.zeros(64)}, str(path / "zz.safetensors"))
    assert same_as_original(tiny_models, "qwen3-untied", path)


def test_model_safetensors_wins_over_the_index(tiny_models, tmp_path):
    """两样都有时 HF 读 model.safetensors、不看索引：把分片里的 norm 改成 0，结果也不受影响。"""
    path = copy_model(tiny_models, "qwen3-untied", tmp_path)
    weight_map = json.loads((path / "model.safetensors.index.json").read_text())["weight_map"]
    full = {}
    for shard in sorted(set(weight_map.values())):
        full.update(load_safetensors_bytes((path / shard).read_bytes()))
    save_file(full, str(path / "model.safetensors"))
    add_to_file(path / weight_map["model.norm.weight"], {"model.norm.weight": torch.zeros(64)})
    assert same_as_original(tiny_models, "qwen3-untied", path)


def test_task6_duplicate_key_across_shards_is_refused(tiny_models, tmp_path):
    """两个分片都有 model.norm.weight：哪份算数说不清，拒绝，说出键和两个文件。"""
    path = copy_model(tiny_models, "qwen3-untied", tmp_path)
    weight_map = json.loads((path / "model.safetensors.index.json").read_text())["weight_map"]
    home = weight_map["model.norm.weight"]
    other = sorted(set(weight_map.values()) - {home})[0]
    add_to_file(path / other, {"model.norm.weight": torch.zeros(64)})
    with expect_error("ch3/duplicate_key", key="model.norm.weight", file_a=home, file_b=other):
        stream(path, build_meta(config_of(path)))


# ---------------------------------------------------------------- 只读普通文件

def stream_with_timeout(path, seconds=30):
    """在线程里加载，卡住就算失败（再往 FIFO 的写端开一下，放走卡住的读者）。"""
    result = {}

    def target():
        try:
            result["value"] = stream(path, build_meta(config_of(path)))
        except Exception as e:  # noqa: BLE001 —— 交给调用方检查
            result["error"] = e

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        for fifo in path.glob("*.safetensors"):
            if fifo.is_fifo():
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        pytest.fail(f"加载 {path} 卡住了 {seconds} 秒")
    return result


def make_fifo_or_dir(file, kind):
    if kind == "fifo":
        os.mkfifo(file)
    elif kind == "dir":
        file.mkdir()
    else:
        file.symlink_to("/dev/zero")


@pytest.mark.parametrize("kind", ["fifo", "dir", "device"])
def test_task6_model_safetensors_that_is_not_a_regular_file(tiny_models, tmp_path, kind):
    path = copy_model(tiny_models, "qwen3-tied", tmp_path)
    (path / "model.safetensors").unlink()
    make_fifo_or_dir(path / "model.safetensors", kind)
    result = stream_with_timeout(path)
    check_error("ch3/not_regular_file", result.get("error"), name="model.safetensors")


@pytest.mark.parametrize("kind", ["fifo", "dir", "device"])
def test_task6_indexed_shard_that_is_not_a_regular_file(tiny_models, tmp_path, kind):
    path = copy_model(tiny_models, "qwen3-untied", tmp_path)
    shard = sorted(set(json.loads((path / "model.safetensors.index.json").read_text())["weight_map"].values()))[-1]
    (path / shard).unlink()
    make_fifo_or_dir(path / shard, kind)
    result = stream_with_timeout(path)
    check_error("ch3/not_regular_file", result.get("error"), name=shard)


def test_stray_fifo_next_to_model_safetensors_does_not_hang(tiny_models, tmp_path):
    path = copy_model(tiny_models, "qwen3-tied", tmp_path)
    os.mkfifo(path / "zz.safetensors")
    result = stream_with_timeout(path)
    assert "error" not in result, result["error"]


# ---------------------------------------------------------------- 滑动窗口

def sliding_qwen2(tiny_models, tmp_path, use, layer_types=None):
    """layer_types=None：像 transformers 4 写的真配置那样不写，由 use_sliding_window 和 max_window_layers 推出来。"""
    path = copy_model(tiny_models, "qwen2", tmp_path)
    edit_config(path, use_sliding_window=use, sliding_window=4, max_window_layers=1, layer_types=layer_types)
    return path


@pytest.mark.parametrize("explicit", [False, True])
def test_task1_sliding_window_config_is_refused(tiny_models, tmp_path, explicit):
    """HF 对第 1 层起用 4 个 token 的窗口；我们只有全注意力，长过窗口后 token 就不同：拒绝，说出层和窗口。"""
    types = ["full_attention", "sliding_attention", "sliding_attention"] if explicit else None
    path = sliding_qwen2(tiny_models, tmp_path, True, types)
    assert "sliding_attention" in AutoConfig.from_pretrained(path).layer_types
    with expect_error("ch3/sliding_window", layer_type="sliding_attention", window=4):
        ModelConfig.from_hf(load_hf_config(str(path)))


def test_sliding_window_set_but_unused_still_loads(tiny_models, tmp_path):
    """真的 Qwen2.5 配置大多写着 use_sliding_window=false 和一个 sliding_window：HF 全用全注意力，我们照常加载。"""
    path = sliding_qwen2(tiny_models, tmp_path, False)
    assert set(AutoConfig.from_pretrained(path).layer_types) == {"full_attention"}
    assert ModelConfig.from_hf(load_hf_config(str(path))) == config_of(tiny_models["qwen2"])


# ---------------------------------------------------------------- config.json 比权重小

def test_task6_shard_errors_name_the_file_and_tensor(tiny_models, tmp_path, monkeypatch):
    """算子的 shard() 发现形状不对时只知道形状；加载器补上是哪个文件、哪个张量。"""
    path = tiny_models["qwen3-tied"]
    model = build_meta(config_of(path))
    key = "model.layers.1.post_attention_layernorm.weight"
    reason = "检查点里的形状是 (64,)，按 config 应当是 (63,)"

    def refuse(full, part=0):
        raise ValueError(reason)

    monkeypatch.setattr(op_of(model, key.rsplit(".", 1)[0]), "shard", refuse)  # 只有这一个算子拒绝
    with expect_error("ch3/shard_shape", file=path / "model.safetensors", key=key, engine=key, reason=reason):
        stream(path, model)


@pytest.mark.parametrize("tp", [1, 2])
@pytest.mark.parametrize("field, value, tensor", [
    ("vocab_size", 200, "model.embed_tokens.weight"),
    ("intermediate_size", 64, "mlp."),
    ("num_attention_heads", 2, "self_attn."),
    ("num_key_value_heads", 1, "self_attn."),
])
def test_task6_config_smaller_than_weights_is_refused__needs_layer_shard_checks(tiny_models, tmp_path, tp, field, value,
                                                                          tensor):
    """HF 在这里报 size mismatch；只切不查的 shard() 会悄悄截掉多出来的行，模型照跑、token 全错。
    形状检查在各算子的 shard() 里（第 2 章的 layers/），加载器负责说出文件和张量。"""
    path = copy_model(tiny_models, "qwen3-tied", tmp_path)
    cfg = json.loads((path / "config.json").read_text())
    assert cfg[field] > value, (field, cfg[field])
    extra = {"head_dim": cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]}
    edit_config(path, **{field: value}, **extra)
    for rank in range(tp):
        model = build_meta(config_of(path), rank=rank, size=tp)
        refused = refusals(path, model, rank, tp)
        assert all(tensor in r["key"] for r in refused), refused
        with expect_error("ch3/shard_shape", one_of=refused):
            load_into(model, path, rank=rank, size=tp)


# ---------------------------------------------------------------- 分词器和 prompt

def test_load_tokenizer_names_the_missing_files(tiny_models, tmp_path):
    """缺词表文件时 AutoTokenizer 不报错，给的分词器把什么都编码成 []。"""
    path = copy_model(tiny_models, "qwen3-tied", tmp_path)
    for f in TOKENIZER_FILES:
        (path / f).unlink(missing_ok=True)
    with expect_error("ch3/missing_tokenizer", path=path):
        load_tokenizer(str(path))
    assert load_tokenizer(str(tiny_models["qwen3-tied"]))("hi").input_ids


def test_cli_missing_tokenizer_files(checkpoint, tiny_models, tmp_path):
    path = copy_model(tiny_models, checkpoint.families[0], tmp_path)
    for f in TOKENIZER_FILES:
        (path / f).unlink(missing_ok=True)
    res = cli(checkpoint, ["--model", str(path), "--prompt", "Hello", "--max-new-tokens", "2"])
    expect_exit("ch3/cli_missing_tokenizer", res)


def test_cli_empty_prompt(checkpoint, tiny_models):
    res = cli(checkpoint, ["--model", str(tiny_models[checkpoint.families[0]]), "--prompt", "Hello", "--prompt", "",
                           "--max-new-tokens", "2"])
    expect_exit("ch3/cli_empty_prompt", res)
