"""Integrations with agent frameworks, each an optional extra: ``agentjournal[<name>]``.

Each module imports its framework; ``import agentjournal`` imports none of them.
"""
