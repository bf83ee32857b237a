"""Views: pure functions from analysis results to figures, HTML or text.

No display, no files, no allocator access.
"""
