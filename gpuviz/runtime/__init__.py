"""The device runtime: devices, placement, transfers and DeviceArrays over gpuviz's allocators.

A source of events (design.md): it drives the capture layer and never imports analysis,
views or front-ends.
"""
