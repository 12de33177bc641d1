"""第 3 章起：超出 RoPE 表的位置在生成之前就拒绝，说出 max_position_embeddings（而不是前向里的 IndexError）。"""

from tests.harness.contract import run_subprocess


def test_positions_past_max_position_embeddings_are_refused(checkpoint, tiny_models):
    model = tiny_models[checkpoint.families[0]]  # 小模型的 max_position_embeddings 是 512
    res = run_subprocess(checkpoint.entry_path, ["--model", str(model), "--prompt", "Hi", "--max-new-tokens", "600"])
    assert res.returncode != 0
    assert "max_position_embeddings" in res.stderr and "Traceback" not in res.stderr, res.stderr[-2000:]
