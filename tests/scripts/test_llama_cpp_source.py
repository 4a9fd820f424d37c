"""scripts/llama-cpp-source.sh: the one pin, the archive checked against its pinned SHA-256, the
patch series applied in order, a version stamped with the patches' hash, and a build stopped by
name when a patch does not apply."""

from __future__ import annotations

import hashlib
import io
import shutil
import subprocess
import tarfile
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "llama-cpp-source.sh"
RELEASE = (REPO / "patches" / "llama-cpp-python.version").read_text().strip()


def run(*args: str, patches: Path | None = None) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin"}
    if patches is not None:
        env["ARBOR_PATCHES"] = str(patches)
    return subprocess.run([shutil.which("bash"), str(SCRIPT), *args], env=env, capture_output=True, text=True,
                          timeout=60)


def fake_sdist(tmp: Path, release: str, ggml_h: str) -> Path:
    """A release archive with just the files the patches below touch."""
    path = tmp / f"llama_cpp_python-{release}.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        for name, text in ((f"llama_cpp_python-{release}/llama_cpp/__init__.py", f'__version__ = "{release}"\n'),
                           (f"llama_cpp_python-{release}/vendor/llama.cpp/ggml.h", ggml_h)):
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def pin(patches: Path, sdist: Path) -> None:
    """Pin `sdist`'s SHA-256 in the patch set, as patches/llama-cpp-python.sha256 does."""
    digest = hashlib.sha256(sdist.read_bytes()).hexdigest()
    (patches / "llama-cpp-python.sha256").write_text(f"{digest}  {sdist.name}\n")


def patch_set(tmp: Path, *patches: tuple[str, str]) -> Path:
    root = tmp / "patches"
    (root / "llama.cpp").mkdir(parents=True)
    (root / "llama-cpp-python.version").write_text("9.8.7\n")
    for name, text in patches:
        (root / "llama.cpp" / name).write_text(text)
    return root


ADD_LINE = """--- a/vendor/llama.cpp/ggml.h
+++ b/vendor/llama.cpp/ggml.h
@@ -1,2 +1,3 @@
 int a;
+int paged;
 int b;
"""


def test_the_pin_is_one_release_and_pyproject_says_the_same():
    assert run("--spec").stdout.strip() == f"llama-cpp-python=={RELEASE}"
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    assert [d for d in deps if d.startswith("llama-cpp-python")] == [f"llama-cpp-python=={RELEASE}"]


def test_the_version_names_the_release_and_the_patches():
    version = run("--version").stdout.strip()
    assert version.startswith(f"{RELEASE}+arbor.") and len(version.split("+arbor.")[1]) == 12


def test_patches_apply_in_order_and_stamp_the_version(tmp_path):
    second = ADD_LINE.replace("+int paged;\n int b;", " int b;\n+int pages;").replace("-1,2 +1,3", "-1,3 +1,4")
    second = second.replace(" int a;\n int b;", " int a;\n int paged;\n int b;")
    patches = patch_set(tmp_path, ("0001-add.patch", ADD_LINE), ("0002-more.patch", second))
    sdist = fake_sdist(tmp_path, "9.8.7", "int a;\nint b;\n")
    pin(patches, sdist)
    done = run("--sdist", str(sdist), str(tmp_path / "src"), patches=patches)
    assert done.returncode == 0, done.stderr
    src = Path(done.stdout.strip().splitlines()[-1])
    assert (src / "vendor/llama.cpp/ggml.h").read_text() == "int a;\nint paged;\nint b;\nint pages;\n"
    version = run("--version", patches=patches).stdout.strip()
    assert (src / "llama_cpp/__init__.py").read_text() == f'__version__ = "{version}"\n'
    assert "applied 0001-add.patch" in done.stderr and "applied 0002-more.patch" in done.stderr


def test_a_patch_that_does_not_apply_stops_with_its_name(tmp_path):
    patches = patch_set(tmp_path, ("0001-add.patch", ADD_LINE))
    sdist = fake_sdist(tmp_path, "9.8.7", "something else entirely\n")
    pin(patches, sdist)
    done = run("--sdist", str(sdist), str(tmp_path / "src"), patches=patches)
    assert done.returncode == 1
    assert "patch 0001-add.patch does not apply to llama-cpp-python 9.8.7" in done.stderr
    assert done.stdout == ""  # no source directory is handed on


def test_an_archive_that_is_not_the_pinned_one_is_refused(tmp_path):
    patches = patch_set(tmp_path, ("0001-add.patch", ADD_LINE))
    sdist = fake_sdist(tmp_path, "9.8.7", "int a;\nint b;\n")
    pin(patches, sdist)
    sdist.write_bytes(sdist.read_bytes() + b"\0")  # tampered with after the pin
    done = run("--sdist", str(sdist), str(tmp_path / "src"), patches=patches)
    assert done.returncode == 1 and "not the pinned" in done.stderr and done.stdout == ""
    (patches / "llama-cpp-python.sha256").unlink()
    done = run("--sdist", str(sdist), str(tmp_path / "src"), patches=patches)
    assert done.returncode == 1 and "SHA-256 must be pinned" in done.stderr


def test_the_real_pin_names_the_pinned_release():
    line = (REPO / "patches" / "llama-cpp-python.sha256").read_text().split()
    assert len(line[0]) == 64 and line[1] == f"llama_cpp_python-{RELEASE}.tar.gz"


def test_a_range_in_the_pin_file_is_refused(tmp_path):
    patches = patch_set(tmp_path, ("0001-add.patch", ADD_LINE))
    (patches / "llama-cpp-python.version").write_text(">=0.3,<0.4\n")
    done = run("--version", patches=patches)
    assert done.returncode == 1 and "not one exact release" in done.stderr


def test_the_real_patches_apply_to_the_pinned_release_when_its_archive_is_cached(tmp_path):
    """The real series applies to the pinned release (scripts/setup.sh keeps its archive in ~/.cache/arbor)."""
    archive = Path.home() / f".cache/arbor/sdist/llama_cpp_python-{RELEASE}.tar.gz"
    if not archive.is_file():
        import pytest

        pytest.skip(f"{archive} is missing: run scripts/setup.sh")
    done = run("--sdist", str(archive), str(tmp_path / "src"))
    assert done.returncode == 0, done.stderr
    src = Path(done.stdout.strip().splitlines()[-1])
    assert "llama_set_paged_attn" in (src / "vendor/llama.cpp/include/llama.h").read_text()
