"""Neutral code shared by the engine, the constraint sidecar and the front doors.

Pure Python: no torch, no xgrammar, no server.
"""
