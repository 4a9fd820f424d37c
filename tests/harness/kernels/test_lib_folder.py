"""harness/kernels/lib_folder.py: a folder for LLAMA_CPP_LIB_PATH whose names of one library are
different files is refused, where the loader and ctypes would otherwise open different builds in one process."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.kernels.lib_folder import LibFolderError, check_lib_folder

NAMES = ("libggml-cpu.so", "libggml-cpu.so.0", "libggml-cpu.so.0.25.3")


def folder_of(tmp_path: Path, contents: dict[str, bytes]) -> Path:
    for name, data in contents.items():
        (tmp_path / name).write_bytes(data)
    return tmp_path


def test_copies_of_one_build_pass(tmp_path):
    check_lib_folder(folder_of(tmp_path, {**dict.fromkeys(NAMES, b"build A"), "libllama.so": b"llama"}))


def test_links_to_one_build_pass(tmp_path):
    (tmp_path / NAMES[2]).write_bytes(b"build A")
    for name in NAMES[:2]:
        (tmp_path / name).symlink_to(NAMES[2])
    check_lib_folder(tmp_path)


def test_one_name_replaced_by_another_build_is_refused(tmp_path):
    """The mistake it exists for: a wheel's folder copied and only the versioned file replaced."""
    folder = folder_of(tmp_path, {NAMES[0]: b"build A", NAMES[1]: b"build A", NAMES[2]: b"build B"})
    with pytest.raises(LibFolderError) as err:
        check_lib_folder(folder)
    assert "names of libggml-cpu are different files (libggml-cpu.so, libggml-cpu.so.0; libggml-cpu.so.0.25.3)" \
        in str(err.value)


def test_a_missing_folder_is_refused(tmp_path):
    with pytest.raises(LibFolderError, match="not a folder"):
        check_lib_folder(tmp_path / "absent")


def test_llama_cpp_pythons_own_folder_passes():
    llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (run scripts/setup.sh)")
    check_lib_folder(Path(llama_cpp.__file__).parent / "lib")
