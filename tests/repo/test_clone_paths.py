"""仓库克隆在哪儿都一样：路径里有一层叫 repo 的目录、有空格、有汉字时，按路径挑文件的仓库级测试照样通过。

这些测试挑文件时看的是仓库里的相对路径（p.relative_to(ROOT)），不是绝对路径：克隆在 ~/repo/ 下时，
绝对路径里的 "repo" 不该让它们把每个文件都当成 tests/repo/ 的文件跳过。
"""

import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# 按路径挑文件的测试：源码里有 rglob / os.walk / .parts 的那些。test_course_path 不在内：它挑的是临时目录里读者的文件
FILTERING = re.compile(r"rglob\(|os\.walk\(|\.parts\b")
NOT_HERE = {"test_course_path.py", Path(__file__).name}


def _path_filtering_tests() -> list[str]:
    return sorted(f"tests/repo/{p.name}" for p in (ROOT / "tests" / "repo").glob("test_*.py")
                  if p.name not in NOT_HERE and FILTERING.search(p.read_text(encoding="utf-8")))


def test_path_filters_pass_from_a_clone_under_repo_with_a_space_and_chinese(tmp_path):
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, capture_output=True,
                           check=True).stdout.decode().split("\0")
    clone = tmp_path / "repo" / "我的 课程" / "mini-sglang"
    for rel in filter(None, files):
        src = ROOT / rel
        if src.is_file():
            (clone / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, clone / rel)
    if (ROOT / "models" / "tiny").is_dir():  # 省掉重新生成小模型
        shutil.copytree(ROOT / "models" / "tiny", clone / "models" / "tiny")
    tests = _path_filtering_tests()
    assert len(tests) >= 5, tests
    res = subprocess.run([sys.executable, "-m", "pytest", *tests, "-q", "-p", "no:cacheprovider", "-x"], cwd=clone,
                         capture_output=True, text=True)
    assert res.returncode == 0, f"在 {clone} 里：\n{res.stdout[-4000:]}\n{res.stderr[-2000:]}"
    assert " passed" in res.stdout.strip().splitlines()[-1]
