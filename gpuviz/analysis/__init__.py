"""Analysis: pure functions of an EventLog (no I/O, no plotting)."""
