"""Where runs are kept: the run directory (`rundir.py`), a folder of files a person can read."""
