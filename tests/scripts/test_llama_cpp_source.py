"""scripts/llama-cpp-source.sh: the one pin, the archive checked against its pinned SHA-256, native/ copied in
and the topic series applied in order with `git am -3`, a version stamped with the hash of both, a build stopped
by name when a topic does not apply, and the reverse: a --tree whose topic commits --regenerate writes back."""

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


def run(*args: str, patches: Path | None = None, native: Path | None = None) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(Path.home())}
    if patches is not None:
        env["ARBOR_PATCHES"] = str(patches)
    if native is not None:
        env["ARBOR_NATIVE"] = str(native)
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


def topic(subject: str, diff: str) -> str:
    """`diff` as `git format-patch` writes a topic: an mbox message with a Subject."""
    return (f"From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001\nFrom: Arbor <arbor@localhost>\n"
            f"Date: Sat, 1 Jan 2000 00:00:00 +0000\nSubject: [PATCH] {subject}\n\nWhy it is there.\n---\n"
            f"diff --git a/vendor/llama.cpp/ggml.h b/vendor/llama.cpp/ggml.h\n{diff}")


ADD_LINE = topic("ggml: add a line", """--- a/vendor/llama.cpp/ggml.h
+++ b/vendor/llama.cpp/ggml.h
@@ -1,2 +1,3 @@
 int a;
+int paged;
 int b;
""")


def test_the_pin_is_one_release_and_pyproject_says_the_same():
    assert run("--spec").stdout.strip() == f"llama-cpp-python=={RELEASE}"
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    assert [d for d in deps if d.startswith("llama-cpp-python")] == [f"llama-cpp-python=={RELEASE}"]


def test_the_version_names_the_release_and_the_patches():
    version = run("--version").stdout.strip()
    assert version.startswith(f"{RELEASE}+arbor.") and len(version.split("+arbor.")[1]) == 12


def test_patches_apply_in_order_and_stamp_the_version(tmp_path):
    second = ADD_LINE.replace("+int paged;\n int b;", " int b;\n+int pages;").replace("-1,2 +1,3", "-1,3 +1,4")
    second = second.replace(" int a;\n int b;", " int a;\n int paged;\n int b;").replace("add a line", "one more")
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


def test_native_sources_are_copied_in_and_stamped_into_the_version(tmp_path):
    patches = patch_set(tmp_path, ("0001-add.patch", ADD_LINE))
    native = tmp_path / "native"
    (native / "src").mkdir(parents=True)
    (native / "src" / "pages.cpp").write_text("int pages(void) { return 1; }\n")
    sdist = fake_sdist(tmp_path, "9.8.7", "int a;\nint b;\n")
    pin(patches, sdist)
    done = run("--sdist", str(sdist), str(tmp_path / "src"), patches=patches, native=native)
    assert done.returncode == 0, done.stderr
    src = Path(done.stdout.strip().splitlines()[-1])
    assert (src / "vendor/llama.cpp/src/pages.cpp").read_text() == "int pages(void) { return 1; }\n"
    assert not (src / ".git").exists()  # the build's own repository is gone; the archive's own is left as it was
    before = run("--version", patches=patches, native=native).stdout.strip()
    (native / "src" / "pages.cpp").write_text("int pages(void) { return 2; }\n")
    assert run("--version", patches=patches, native=native).stdout.strip() != before  # an edit rebuilds


def test_a_native_file_that_would_replace_llama_cpps_own_is_refused(tmp_path):
    patches = patch_set(tmp_path, ("0001-add.patch", ADD_LINE))
    native = tmp_path / "native"
    native.mkdir()
    (native / "ggml.h").write_text("int replaced;\n")
    sdist = fake_sdist(tmp_path, "9.8.7", "int a;\nint b;\n")
    pin(patches, sdist)
    done = run("--sdist", str(sdist), str(tmp_path / "src"), patches=patches, native=native)
    assert done.returncode == 1 and "native/ggml.h would replace llama.cpp's own" in done.stderr


def test_a_tree_regenerates_its_topics_and_copies_native_edits_back(tmp_path):
    patches = patch_set(tmp_path, ("0001-ggml-add-a-line.patch", ADD_LINE))
    native = tmp_path / "native"
    native.mkdir()
    (native / "paged.cu").write_text("// v1\n")
    sdist = fake_sdist(tmp_path, "9.8.7", "int a;\nint b;\n")
    pin(patches, sdist)
    done = run("--tree", "--sdist", str(sdist), str(tmp_path / "tree"), patches=patches, native=native)
    assert done.returncode == 0, done.stderr
    src = Path(done.stdout.strip().splitlines()[-1])
    log = subprocess.run(["git", "-C", str(src), "log", "--format=%s"], capture_output=True, text=True).stdout
    assert log.splitlines() == ["ggml: add a line", "arbor: native sources (native/, copied; not a topic)",
                                "llama-cpp-python 9.8.7 (the pinned release)"]
    # nothing changed: the same topic back (in format-patch's own form: a diffstat, full blob ids) ...
    assert run("--regenerate", str(src), patches=patches, native=native).returncode == 0
    assert [p.name for p in (patches / "llama.cpp").iterdir()] == ["0001-ggml-add-a-line.patch"]
    first = (patches / "llama.cpp" / "0001-ggml-add-a-line.patch").read_text()
    assert "Subject: [PATCH] ggml: add a line\n\nWhy it is there.\n" in first
    assert ADD_LINE[ADD_LINE.index("--- a/"):] in first
    # ... and a tree made from that regenerates it byte for byte
    again = run("--tree", "--sdist", str(sdist), str(tmp_path / "again"), patches=patches, native=native)
    assert run("--regenerate", again.stdout.strip().splitlines()[-1], patches=patches, native=native).returncode == 0
    assert (patches / "llama.cpp" / "0001-ggml-add-a-line.patch").read_text() == first
    # an edit of a native file stays uncommitted and goes back to native/
    (src / "vendor/llama.cpp/paged.cu").write_text("// v2\n")
    assert run("--regenerate", str(src), patches=patches, native=native).returncode == 0
    assert (native / "paged.cu").read_text() == "// v2\n"
    # a topic that adds a file is refused: new code belongs in native/
    (src / "vendor/llama.cpp/new.c").write_text("int n;\n")
    git = ["git", "-C", str(src), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "add", "vendor/llama.cpp/new.c"], check=True)
    subprocess.run([*git, "commit", "-q", "--amend", "--no-edit"], check=True)
    refused = run("--regenerate", str(src), patches=patches, native=native)
    assert refused.returncode == 1 and "new code of Arbor's belongs in native/" in refused.stderr


def test_a_topic_that_does_not_apply_leaves_a_tree_mid_series_to_resolve(tmp_path):
    """A new release: --tree names the topic that does not apply and leaves `git am` in progress there, so the
    developer resolves it and `git am --continue` applies the rest (DEVELOPERS.md, "Changing llama.cpp")."""
    patches = patch_set(tmp_path, ("0001-ggml-add-a-line.patch", ADD_LINE))
    sdist = fake_sdist(tmp_path, "9.8.7", "int a;\nint c;\n")  # the release moved on: b became c
    pin(patches, sdist)
    done = run("--tree", "--sdist", str(sdist), str(tmp_path / "tree"), patches=patches)
    assert done.returncode == 1 and "patch 0001-ggml-add-a-line.patch does not apply" in done.stderr
    src = tmp_path / "tree" / "llama_cpp_python-9.8.7"
    assert (src / ".git" / "rebase-apply").is_dir()  # mid-series, not aborted
    shown = subprocess.run(["git", "-C", str(src), "am", "--show-current-patch=diff"], capture_output=True, text=True)
    assert "+int paged;" in shown.stdout


def test_the_real_series_applies_and_is_as_regenerate_writes_it(tmp_path):
    """The real series applies to the pinned release (scripts/setup.sh keeps its archive in ~/.cache/arbor), copies
    native/ in, and is in the form --regenerate writes: a --tree of it regenerates the same topics byte for byte, so
    no topic was edited by hand and every fix is amended into its topic."""
    archive = Path.home() / f".cache/arbor/sdist/llama_cpp_python-{RELEASE}.tar.gz"
    if not archive.is_file():
        import pytest

        pytest.skip(f"{archive} is missing: run scripts/setup.sh")
    done = run("--sdist", str(archive), str(tmp_path / "src"))
    assert done.returncode == 0, done.stderr
    src = Path(done.stdout.strip().splitlines()[-1])
    assert "llama_set_paged_attn" in (src / "vendor/llama.cpp/include/llama.h").read_text()
    for f in (REPO / "native").rglob("*"):
        if f.is_file() and f.name != "README.md":
            assert (src / "vendor/llama.cpp" / f.relative_to(REPO / "native")).read_bytes() == f.read_bytes()
    copy = tmp_path / "copy"
    shutil.copytree(REPO / "patches", copy / "patches")
    shutil.copytree(REPO / "native", copy / "native")
    tree = run("--tree", "--sdist", str(archive), str(tmp_path / "tree"), patches=copy / "patches")
    assert tree.returncode == 0, tree.stderr
    regenerated = run("--regenerate", tree.stdout.strip().splitlines()[-1], patches=copy / "patches")
    assert regenerated.returncode == 0, regenerated.stderr
    topics = sorted((REPO / "patches" / "llama.cpp").glob("*.patch"))
    assert [p.name for p in sorted((copy / "patches" / "llama.cpp").glob("*.patch"))] == [p.name for p in topics]
    for p in topics:
        assert (copy / "patches" / "llama.cpp" / p.name).read_bytes() == p.read_bytes(), p.name
