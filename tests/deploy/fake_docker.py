"""A stand-in for the `docker` CLI, for testing scripts/verify_deploy.sh without an engine.

Installed as an executable named `docker` on PATH by the tests. It answers the few commands
the script uses from a JSON scenario file named by FAKE_DOCKER_SCENARIO:
  {"services": {"<name>": {"cid": "...", "states": ["running starting", "running healthy"],
                           "port": "127.0.0.1:12345", "health_log": "..."}},
   "exec_rc": 0}
Each `docker inspect` of a container returns its next state (the last one repeats). Every
call is appended to FAKE_DOCKER_CALLS, one JSON list per line: the name it was called by
(FAKE_DOCKER_NAME, default "docker"), then its arguments.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    scenario_path = Path(os.environ["FAKE_DOCKER_SCENARIO"])
    scenario = json.loads(scenario_path.read_text())
    with open(os.environ["FAKE_DOCKER_CALLS"], "a") as calls:
        calls.write(json.dumps([os.environ.get("FAKE_DOCKER_NAME", "docker"), *argv]) + "\n")
    services = scenario["services"]
    by_cid = {s["cid"]: s for s in services.values()}

    if argv[:2] == ["compose", "version"]:
        print("Docker Compose version v2.99.0-fake")
        return 0
    if argv[:3] == ["compose", "ps", "-q"]:
        service = services.get(argv[3])
        if service:
            print(service["cid"])
        return 0
    if argv[:2] == ["compose", "port"]:
        service = services.get(argv[2])
        if service and service.get("port"):
            print(service["port"])
        return 0
    if argv[:2] == ["compose", "exec"]:
        return int(scenario.get("exec_rc", 0))
    if argv[:1] == ["inspect"]:
        fmt, cid = argv[2], argv[3]
        service = by_cid[cid]
        if "Health.Log" in fmt:
            print(service.get("health_log", ""))
            return 0
        seen = service.setdefault("_inspected", 0)
        states = service["states"]
        print(states[min(seen, len(states) - 1)])
        service["_inspected"] = seen + 1
        scenario_path.write_text(json.dumps(scenario))
        return 0
    print(f"fake docker: unsupported command {argv}", file=sys.stderr)
    return 99


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
