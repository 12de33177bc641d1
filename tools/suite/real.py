"""真权重一档跑不跑、跑之前先备好模型；不跑时说一行为什么（python -m tools.run_tests 用）。"""

from __future__ import annotations

from tools.manifest import given_test_patterns, load_tasks
from tools.models.find import find_model, unsupported_reason


def real_present() -> bool:
    """course.py check（--real-if-present）：有真模型就带上真权重一档，没有就说一声。"""
    real = find_model()
    if real is None:
        print("真权重一档：跳过（models/ 下没有真模型；python -m tools.models.make_smollm2 做一个）", flush=True)
    return real is not None


def prepare_real() -> None:
    """还没有真模型就先做 SmolLM2（只做一次，免得几个进程同时做）；做不出来时测试随后失败并说明。"""
    from tools.models.make_smollm2 import ModelUnavailable

    try:
        find_model(make=True)
    except ModelUnavailable as e:
        print(f"真权重一档没有模型：\n{e}", flush=True)


def real_tier(args, ck) -> bool:
    """这次跑不跑真权重一档，并说出为什么不跑（不起一个只为跳过的进程）。--own 不跑；--task K 只在明说了
    --real、而且任务 K 含它（tests/tasks.toml）时跑：--task 是要快的反馈。"""
    if not (args.real or args.real_if_present):
        return False
    if args.own:
        print("真权重一档：--own 只跑本章的任务，没有跑", flush=True)
        return False
    if args.task:
        task = next((t for t in load_tasks().get(ck.chapter, []) if t.number == args.task), None)
        if task is None or not any(p.startswith("tests/real/") for p in task.tests):
            print(f"真权重一档：任务 {args.task} 不含它（tests/tasks.toml），没有跑", flush=True)
            return False
        if not args.real:
            print(f"真权重一档：任务 {args.task} 含它，--task 只要快的反馈，这次没跑（加 --real 才跑）", flush=True)
            return False
    elif not args.real and not real_present():
        return False
    real = find_model()
    why = unsupported_reason(ck, real.path) if real is not None else None
    if why:
        print(f"真权重一档：这一章不跑（不是问题）：{why}；这一章用离线小模型对齐 HF", flush=True)
        return False
    if real is not None:
        print(f"真权重一档：用真模型 {real.path}，和 HF 逐 token 对齐（进度表上单独一行，不算进任务）", flush=True)
        if not args.real:  # check 自己带上的：告诉读者怎么只要快的反馈
            given = "、给定代码自己的测试" if given_test_patterns(ck.chapter) else ""
            print(f"      只要快的反馈：--task K 只跑本章的任务 K；--own 只跑本章的全部任务（不跑前面各章的测试、"
                  f"真权重一档{given}）", flush=True)
    return True
