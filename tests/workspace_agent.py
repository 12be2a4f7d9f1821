"""A child process for tests/test_workspace.py: the file-editing agent, run (or resumed)
until it finishes, printing its status. Run from the repository root:

    python -m tests.workspace_agent --store URL --run-id ID --dir DIR --shadow DIR
"""

from __future__ import annotations

import argparse
import sys

from agentjournal import open_store
from agentjournal.workspace import Workspace

from .test_workspace import editor


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.workspace_agent")
    for name in ("--store", "--run-id", "--dir", "--shadow"):
        parser.add_argument(name, required=True)
    args = parser.parse_args(argv)
    agent = editor(Workspace(args.dir, shadow=args.shadow))
    with open_store(args.store) as store:
        print(agent.run(store, args.run_id, "edit the files").status)
    return 0


if __name__ == "__main__":
    sys.exit(main())
