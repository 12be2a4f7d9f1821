"""The quarterly-reconciliation demo: a ledger service and a scripted agent."""
