"""把一个检查点里修好的文件往后带：依次复制到后面每个"没改过这个文件"的检查点，
遇到一个自己也改了它的检查点就停下，提示你在那里手工合并，再从那里接着带。

    python -m tools.book.carry_forward ch2_ops minisgl/layers/norm.py
    python -m tools.book.carry_forward ch2_ops minisgl/layers/norm.py --dry-run
"""

from __future__ import annotations

import argparse

from tools.manifest import Checkpoint, find_checkpoint, load_manifest


def carry_forward(checkpoints: list[Checkpoint], start: str, rel: str, dry_run: bool = False
                  ) -> tuple[list[str], str | None]:
    """返回 (被更新的检查点名字, 停下的检查点名字或 None)。"""
    names = [c.name for c in checkpoints]
    if start not in names:
        raise SystemExit(f"错误：清单里没有检查点 {start!r}：{names}")
    src = checkpoints[names.index(start)].path / rel
    if not src.is_file():
        raise SystemExit(f"错误：{src} 不存在")
    data, updated = src.read_bytes(), []
    for ck in checkpoints[names.index(start) + 1:]:
        if rel in ck.changes:
            return updated, ck.name
        dst = ck.path / rel
        if dst.read_bytes() != data:
            if not dry_run:
                dst.write_bytes(data)
            updated.append(ck.name)
    return updated, None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("checkpoint", help="修好的文件所在的检查点，例如 ch2_ops 或 ch2")
    ap.add_argument("file", help="检查点内的相对路径，例如 minisgl/layers/norm.py")
    ap.add_argument("--dry-run", action="store_true")
    args = ap.parse_args()
    start = find_checkpoint(args.checkpoint)  # 找不到时清单自己说一行 错误：…
    checkpoints = load_manifest()
    if args.file not in start.changes and start.chapter > 1:
        print(f"注意：{start.name} 的清单没有列出 {args.file}，它是从上一章原样继承的；"
              f"修复通常应该从最早引入这个版本的那一章开始带。")
    updated, stopped = carry_forward(checkpoints, start.name, args.file, args.dry_run)
    verb = "会更新" if args.dry_run else "已更新"
    print(f"{verb}：{', '.join(updated) or '（没有需要更新的）'}")
    if stopped:
        print(f"{stopped} 自己也改了 {args.file}：在那里手工合并这个修复，"
              f"再运行 python -m tools.book.carry_forward {stopped} {args.file}")


if __name__ == "__main__":
    main()
