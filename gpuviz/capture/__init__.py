"""Capture: the allocators, upstreams and recorders that write events into an EventLog.

Capture never imports analysis, views, IPython, ipywidgets or plotly.
"""
