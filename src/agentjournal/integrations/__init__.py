"""Integrations with agent frameworks, each an optional extra (``agentjournal[<framework>]``).

Each module imports its framework; ``import agentjournal`` imports none of them.
"""
