"""Helpers for testing agents offline: ``llm_stub`` is a loopback HTTP server that
speaks OpenAI Chat Completions, OpenAI Responses (with background mode) and Anthropic
Messages, scripted turn by turn, and rejects the conversations the real APIs reject."""
