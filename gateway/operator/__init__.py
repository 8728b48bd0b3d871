"""Operators' side of the gateway: the actions the command line and the console share (each
with its audit entry), and what the console reads."""
