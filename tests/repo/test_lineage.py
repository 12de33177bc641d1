"""检查点的血统：每一章只改它该改的文件，其余文件和上一个检查点逐字节相同。"""

from tools.manifest import Checkpoint, checkpoint_files, load_manifest
from tools.book.carry_forward import carry_forward


def lineage_problems(prev: Checkpoint, cur: Checkpoint) -> list[str]:
    a, b = checkpoint_files(prev.path), checkpoint_files(cur.path)
    problems = []
    for rel in sorted(set(a) | set(b)):
        same = rel in a and rel in b and a[rel] == b[rel]
        if rel in cur.changes and same:
            problems.append(f"{cur.name}: 清单说改了 {rel}，但它和 {prev.name} 的逐字节相同")
        elif rel not in cur.changes and not same:
            what = "新增了" if rel not in a else "删掉了" if rel not in b else "改了"
            problems.append(f"{cur.name}: {what} {rel}，但清单的 changes 里没有它（要么加进清单，要么用 "
                            f"python -m tools.book.carry_forward 把 {prev.name} 的版本带过来）")
    for rel in cur.changes:
        if rel not in a and rel not in b:
            problems.append(f"{cur.name}: 清单列了 {rel}，但两个检查点里都没有这个文件")
    return problems


def test_manifest_points_at_real_checkpoints():
    manifest = load_manifest()
    assert manifest[0].name == "step0_skeleton"
    assert [c.chapter for c in manifest] == list(range(len(manifest)))
    for ck in manifest:
        assert ck.entry_path.is_file(), f"{ck.name} 没有入口 {ck.entry}"


def test_every_unchanged_file_is_byte_identical():
    manifest = load_manifest()
    problems = [p for prev, cur in zip(manifest, manifest[1:]) for p in lineage_problems(prev, cur)]
    assert not problems, "\n".join(problems)


def test_lineage_check_catches_a_stray_edit(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    for d in (a, b):
        (d / "pkg").mkdir(parents=True)
        (d / "pkg" / "x.py").write_text("x = 1\n")
    (b / "pkg" / "y.py").write_text("y = 2\n")
    prev = Checkpoint("a", 1, "x", [], [], [], a)
    assert lineage_problems(prev, Checkpoint("b", 2, "x", [], [], ["pkg/y.py"], b)) == []
    (b / "pkg" / "x.py").write_text("x = 2\n")  # 没登记的修改
    assert any("pkg/x.py" in p for p in lineage_problems(prev, Checkpoint("b", 2, "x", [], [], ["pkg/y.py"], b)))


def test_carry_forward_stops_where_a_chapter_changes_the_file(tmp_path):
    cks = []
    for i, changes in enumerate([[], [], ["f.py"], []]):
        d = tmp_path / f"c{i}"
        d.mkdir()
        (d / "f.py").write_text(f"v = {min(i, 2)}\n" if i != 1 else "v = 0\n")
        cks.append(Checkpoint(f"c{i}", i, "f.py", [], [], changes, d))
    (tmp_path / "c0" / "f.py").write_text("v = 'fixed'\n")
    updated, stopped = carry_forward(cks, "c0", "f.py")
    assert updated == ["c1"] and stopped == "c2"
    assert (tmp_path / "c1" / "f.py").read_text() == "v = 'fixed'\n"
    assert (tmp_path / "c2" / "f.py").read_text() == "v = 2\n"
