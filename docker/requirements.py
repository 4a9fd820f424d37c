"""Prints the project's dependencies from pyproject.toml, one a line, without llama-cpp-python.

The workbench never imports llama_cpp, and the server images build it themselves with their
backend's flags (build-llama-cpp.sh), so pip must not build it a second time from this list.
Usage: python requirements.py pyproject.toml > requirements.txt
"""

import sys
import tomllib


def main(path: str) -> None:
    with open(path, "rb") as f:
        deps = tomllib.load(f)["project"]["dependencies"]
    kept = [d for d in deps if not d.replace("_", "-").lower().startswith("llama-cpp-python")]
    print("\n".join(kept))


if __name__ == "__main__":
    main(sys.argv[1])
