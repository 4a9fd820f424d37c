"""docs/deploy.md's offline section names every base image the images of a backend are built from."""

from __future__ import annotations

import re

from tests.deploy.deploy_files import DOCKERFILES, REPO, VARIANTS, load_compose, parse_dockerfile, resolve_base

DOC = (REPO / "docs" / "deploy.md").read_text()
SECTION = DOC[DOC.index("## Offline host: every image it needs"):DOC.index("## What a user on an Ascend host")]
ROWS = {m.group(1): m.group(2) for m in re.finditer(r"^\| (CPU|NVIDIA|Ascend) +\| (.+)\|$", SECTION, re.M)}
BACKEND_ROW = {"cpu": "CPU", "cuda": "NVIDIA", "cann": "Ascend", "cann-2npu": "Ascend"}


def dockerfiles_of(variant: str) -> set[str]:
    """The Dockerfile of each service compose builds for the variant (a later file overrides)."""
    by_service: dict[str, str] = {}
    for file in VARIANTS[variant]:
        for name, service in (load_compose(file).get("services") or {}).items():
            dockerfile = (service.get("build") or {}).get("dockerfile")
            if dockerfile:
                by_service[name] = dockerfile
    return set(by_service.values())


def test_every_base_image_of_every_backend_is_listed_for_an_offline_host():
    assert set(ROWS) == {"CPU", "NVIDIA", "Ascend"}
    for variant, row in BACKEND_ROW.items():
        for dockerfile in dockerfiles_of(variant):
            path = REPO / dockerfile
            assert path in DOCKERFILES.values()
            head, stages = parse_dockerfile(path)
            for stage in stages.values():
                base = resolve_base(stage.base, head)
                # CUDA's tags are written with the setting names, as the user fills them in
                shown = base.replace("12.6.3", "<CUDA_VERSION>").replace("ubuntu24.04", "<CUDA_UBUNTU>")
                if "cann" in base:
                    shown = "CANN_BASE_IMAGE"
                assert shown in ROWS[row], f"{variant}: {dockerfile} is built from {base}, not listed for {row}"
