"""Worked examples of handlers (``GATEWAY_HANDLERS=examples.echo_bot``); see README."""
