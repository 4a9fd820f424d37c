"""harness/kernels/fa_kernel.py at a size that runs in seconds: in one process (paged against unpaged) and across
two library folders (here the same one twice, each in a subprocess): the file holds what it measured."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (run scripts/setup.sh)")


def paged_op_or_skip() -> None:
    from harness.kernels.ggml_fa import has_paged_op

    if not has_paged_op():
        pytest.skip("llama-cpp-python was built without Arbor's paged attention patch")


def test_one_library_paged_against_unpaged(tmp_path):
    paged_op_or_skip()
    from harness.kernels import fa_kernel

    out = tmp_path / "fa.json"
    fa_kernel.main(["--shapes", "1", "--iters", "2", "--rounds", "2", "--out", str(out), "--quiet"])
    got = json.loads(out.read_text())
    name = fa_kernel.SHAPES[1].name
    assert [s["name"] for s in got["shapes"]] == [name]
    assert len(got["rounds"]) == 2 and all(r[name]["paged_ms"] > 0 and r[name]["unpaged_ms"] > 0
                                           for r in got["rounds"])
    ratios = sorted(r[name]["paged_ms"] / r[name]["unpaged_ms"] for r in got["rounds"])
    assert got["paged_over_unpaged"][name] == pytest.approx(sum(ratios) / 2)
    marked = sorted(r[name]["paged_marked_ms"] / r[name]["paged_ms"] for r in got["rounds"])
    assert got["marked_over_paged"][name] == pytest.approx(sum(marked) / 2)
    cut = sorted(r[name]["paged_marked_ms"] / r[name]["paged_marked_uncut_ms"] for r in got["rounds"])
    assert got["cut_over_uncut"][name] == pytest.approx(sum(cut) / 2)


def test_without_cuts_the_marked_table_is_patch_0014s(tmp_path):
    """--no-cuts (libraries before exact page lengths, which would read a cut as page-index bits): the timed marked
    table carries no cut, and no cut-against-uncut figure is made."""
    paged_op_or_skip()
    import numpy as np

    from harness.kernels import fa_kernel
    from harness.kernels.ggml_fa import page_cut

    x = fa_kernel.inputs(fa_kernel.SHAPES[0], np.random.default_rng(0))
    assert any(page_cut(p) for p in x["marked"][:, 2:].ravel()) and not any(page_cut(p) for p in
                                                                             x["marked_uncut"][:, 2:].ravel())
    out = tmp_path / "fa.json"
    fa_kernel.main(["--shapes", "1", "--iters", "2", "--rounds", "1", "--no-cuts", "--out", str(out), "--quiet"])
    got = json.loads(out.read_text())
    assert "cut_over_uncut" not in got and "paged_marked_uncut_ms" not in got["rounds"][0][fa_kernel.SHAPES[1].name]


def test_pages_are_marked_unmasked_where_they_hold_only_the_rows_cells():
    """The marked table is llama.cpp's (unmasked pages, exact lengths): a page whose cells from its start are the row's
    is marked, the first sequence's last page (2900 cells are not whole 16-cell pages) cut where its cells end; the
    second sequence's first page, whose first cells are the first sequence's, keeps the mask."""
    import numpy as np

    from harness.kernels import fa_kernel
    from harness.kernels.ggml_fa import GGML_FA_PAGE_INDEX, GGML_FA_PAGE_UNMASKED, page_cut

    shape = fa_kernel.Shape("two sequences", 4, 2, 64, 2, 40)  # cells 0-39 and 40-79: pages 0-2 and 2-4
    x = fa_kernel.inputs(shape, np.random.default_rng(0))
    assert x["pages"][:, :2].tolist() == [[3, 0], [3, 1]]
    assert (x["marked"][:, :2] == x["pages"][:, :2]).all()
    marks = (x["marked"][:, 2:5] & GGML_FA_PAGE_UNMASKED) != 0
    assert marks.tolist() == [[True, True, True], [False, True, True]]
    assert [[page_cut(p) for p in row] for row in x["marked"][:, 2:5]] == [[0, 0, 8], [0, 0, 0]]
    assert ((x["marked"][:, 2:5] & GGML_FA_PAGE_INDEX) == x["pages"][:, 2:5]).all()


def test_two_library_folders_in_turns(tmp_path):
    paged_op_or_skip()
    from harness.kernels import fa_kernel
    from harness.kernels.ggml_fa import lib_dir

    lib = lib_dir()
    other = tmp_path / "other-build"  # a second folder: links to the same libraries
    other.mkdir()
    for f in lib.iterdir():
        (other / f.name).symlink_to(f.resolve())
    out = tmp_path / "fa.json"
    fa_kernel.main(["--libs", f"{lib},{other}", "--shapes", "1", "--iters", "2", "--rounds", "2", "--out", str(out),
                    "--quiet"])
    got = json.loads(out.read_text())
    name = fa_kernel.SHAPES[1].name
    assert got["libs"] == [str(lib), str(other)]
    assert all(len(got["rounds"][d]) == 2 and got["rounds"][d][1][name]["paged_ms"] > 0 for d in got["libs"])
    assert all(list(r) == [name] for d in got["libs"] for r in got["rounds"][d])  # the subprocesses ran --shapes only
    ratios = sorted(got["rounds"][str(other)][i][name]["paged_ms"] / got["rounds"][str(lib)][i][name]["paged_ms"]
                    for i in range(2))
    assert got["paged_over_base_lib"][str(other)][name] == pytest.approx(sum(ratios) / 2)


def test_a_folder_named_twice_is_refused(tmp_path):
    from harness.kernels import fa_kernel

    with pytest.raises(SystemExit, match="twice"):
        fa_kernel.main(["--libs", "/x,/x", "--out", str(tmp_path / "fa.json")])


def test_a_long_first_sequence_takes_its_own_length():
    """The ragged shape (one long sequence decoding beside short ones): each row sees its own run of cells."""
    import numpy as np

    from harness.kernels import fa_kernel

    shape = fa_kernel.Shape("long beside short", 4, 2, 64, 3, 20, first_seq_cells=50)
    assert shape.lengths() == [50, 20, 20]
    x = fa_kernel.inputs(shape, np.random.default_rng(0))
    assert x["mask"].shape == (3, 90)
    visible = [np.flatnonzero(row == 0).tolist() for row in x["mask"]]
    assert visible == [list(range(0, 50)), list(range(50, 70)), list(range(70, 90))]
    assert x["pages"][:, 0].tolist() == [4, 2, 2]  # pages 0-3, 3-4, 4-5


def test_an_mla_shape_gives_v_its_own_head_size():
    """MLA's shapes (DeepSeek, Kimi): one KV head, K rows 576 wide, V rows 512."""
    import numpy as np

    from harness.kernels import fa_kernel

    shape = fa_kernel.Shape("mla", 128, 1, 576, 2, 20, head_dim_v=512)
    x = fa_kernel.inputs(shape, np.random.default_rng(0))
    assert x["q"].shape == (128, 2, 576) and x["k"].shape == (1, 40, 576) and x["v"].shape == (1, 40, 512)
    assert [s.head_dim_v for s in fa_kernel.SHAPES if s.name.startswith("MLA")] == [512, 512]
