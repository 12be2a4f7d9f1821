"""``python -m agentjournal`` is the ``agentjournal`` command."""

from .cli import main

main()
