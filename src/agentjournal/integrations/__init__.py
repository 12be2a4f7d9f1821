"""Integrations: agentjournal as the durability layer under agent frameworks.

Each framework has a module (or package) of its own here, installed with an extra of
its own; ``import agentjournal`` never imports a framework.
"""
