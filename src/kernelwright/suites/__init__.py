"""Whole suites: problem discovery and candidate matching (`discovery.py`), the runner for
`suite eval` and `suite optimize` (`driver.py`), and the metrics (`metrics.py`, pure functions)."""
