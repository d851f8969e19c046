"""Internal package of wanrt (see docs/); not a public API."""
