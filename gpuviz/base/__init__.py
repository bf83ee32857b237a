"""Bottom layer: units, errors and the HeapState value types.

Nothing here imports any other part of gpuviz.
"""
