"""The event log: columnar storage of events, and its versioned Arrow file format."""
